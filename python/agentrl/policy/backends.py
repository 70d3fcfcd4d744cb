"""Generation backends: one async protocol over a local policy or an HTTP server.

:class:`LocalBackend` runs a :class:`~agentrl.policy.Policy` in a worker thread, so the
event loop (sandbox jobs, the scheduler) stays free while it generates.
:class:`OpenAIBackend` calls an OpenAI-compatible ``/v1/completions`` endpoint (``agentrl
serve``, vLLM, SGLang) through the official ``openai`` package's async client on the running
loop (uvloop works);
token ids come from the ``agentrl`` extension fields of ``agentrl serve`` or from vLLM's
``return_token_ids``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from agentrl.policy.policy import Policy
from agentrl.policy.sampling import Generation, SamplingParams

__all__ = ["BackendError", "GenerationBackend", "LocalBackend", "OpenAIBackend"]


class BackendError(RuntimeError):
    """The backend could not generate (an HTTP error status, a malformed response)."""


@runtime_checkable
class GenerationBackend(Protocol):
    """Anything that completes prompts for the scheduler and the trainer."""

    async def generate(
        self, prompts: Sequence[str], params: SamplingParams
    ) -> list[Generation]: ...

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None: ...


class LocalBackend:
    """A local :class:`Policy`; generation runs in one worker thread (calls queue up)."""

    supports_weight_updates = True

    def __init__(self, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"LocalBackend: policy must be a Policy, got {type(policy).__name__}")
        self.policy = policy
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "agentrl-generate")

    @property
    def version(self) -> int:
        """The policy version generations now start from."""
        return self.policy.version

    async def generate(self, prompts: Sequence[str], params: SamplingParams) -> list[Generation]:
        """Completes ``prompts`` (see :meth:`Policy.generate`) without blocking the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self.policy.generate, list(prompts), params
        )

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Loads new weights; waits for a generation in progress to finish first."""
        self.policy.set_weights(state_dict, version)

    async def aupdate_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """:meth:`update_weights` from a coroutine: waits in a thread, not on the loop."""
        await asyncio.get_running_loop().run_in_executor(
            None, self.policy.set_weights, state_dict, version
        )

    def close(self) -> None:
        """Stops the worker thread (after the queued generations)."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OpenAIBackend:
    """An OpenAI-compatible completion server, through the official ``openai`` package's
    :class:`openai.AsyncOpenAI` client (httpx underneath: pooled keep-alive connections, TLS,
    proxies from the environment).

    ``base_url`` is the server root or its ``/v1`` (``http://127.0.0.1:8000`` or
    ``http://127.0.0.1:8000/v1``). Each :meth:`generate` sends one request with all prompts;
    the log-probs requested are those of the sampled tokens. ``extra_body`` is merged into
    every request (server-specific options); by default it asks vLLM for token ids.
    ``max_retries`` is the openai client's: a failed connection, 408, 409, 429 and 5xx
    answers are retried that many times with exponential back-off (0: never); other error
    statuses raise :class:`BackendError` at once. With ``stream=True`` each request is
    answered as server-sent events and the chunks are put together (the same
    :class:`Generation`; useful where a proxy times out idle responses, or to see tokens as
    they come: ``on_text(prompt_index, delta)`` is called for each text delta).
    """

    supports_weight_updates = False

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        extra_body: dict[str, Any] | None = None,
        max_retries: int = 2,
        stream: bool = False,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIBackend: base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"OpenAIBackend: max_retries must be an int >= 0, got {max_retries!r}")
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.stream = bool(stream)
        self.extra_body = {"return_token_ids": True} if extra_body is None else dict(extra_body)
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def client(self) -> Any:
        """The :class:`openai.AsyncOpenAI` client of the running loop (made on first use;
        its connections belong to one loop, so another loop gets a new client)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            try:
                import openai
            except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
                raise ImportError("OpenAIBackend needs openai: pip install 'agentrl[train]'") from e
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self.api_key or "EMPTY",  # the client insists on a key; servers ignore it
                timeout=self.timeout_s,
                max_retries=self.max_retries,
            )
            self._loop = loop
        return self._client

    async def _call(self, path: str, request: Any) -> Any:
        import openai

        try:
            return await request
        except openai.APIStatusError as e:
            body = e.body
            msg = body.get("message") if isinstance(body, dict) else None
            raise BackendError(f"{path}: HTTP {e.status_code}: {msg or e.message}") from e
        except openai.APITimeoutError as e:
            raise BackendError(f"{path}: timed out after {self.timeout_s} s") from e
        except openai.APIConnectionError as e:
            cause = e.__cause__ or e
            raise BackendError(f"{path}: cannot connect to {self.base_url}: {cause!r}") from e
        except openai.OpenAIError as e:  # a response that is not the API's JSON
            raise BackendError(f"{path}: {e}") from e

    async def models(self) -> list[str]:
        """Ids of the models the server offers."""
        page = await self._call("/models", self.client.models.list())
        return [m.id for m in page.data]

    async def generate(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        *,
        on_text: Callable[[int, str], None] | None = None,
    ) -> list[Generation]:
        """Completes ``prompts`` on the server (one request); ``on_text`` needs ``stream``."""
        if on_text is not None and not self.stream:
            raise ValueError("OpenAIBackend.generate: on_text needs OpenAIBackend(stream=True)")
        if isinstance(prompts, str):
            raise TypeError("generate: prompts must be a sequence of str, not one str")
        prompts = list(prompts)
        if not prompts:
            return []
        kw: dict[str, Any] = {
            "model": self.model,
            "prompt": prompts,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 0,
            "n": 1,
            "extra_body": self.extra_body,
        }
        if params.stop:
            kw["stop"] = list(params.stop)
        if params.seed is not None:
            kw["seed"] = params.seed
        if self.stream:
            data = await self._call("/completions", self._streamed(kw, on_text))
        else:
            resp = await self._call("/completions", self.client.completions.create(**kw))
            data = resp.to_dict()
        choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise BackendError(f"/completions: {len(choices)} choices for {len(prompts)} prompts")
        version = int((data.get("agentrl") or {}).get("policy_version", 0))
        return [self._generation(p, c, version) for p, c in zip(prompts, choices, strict=True)]

    async def _streamed(
        self, kw: dict[str, Any], on_text: Callable[[int, str], None] | None
    ) -> dict[str, Any]:
        """The chunks of a streamed completion, put together as one response body."""
        choices: dict[int, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        stream = await self.client.completions.create(**kw, stream=True)
        async with stream:
            async for chunk in stream:
                d = chunk.to_dict()
                if "error" in d:  # an error after the stream began (vLLM sends one too)
                    raise BackendError(f"/completions: {d['error'].get('message', d['error'])}")
                if "agentrl" in d:
                    top["agentrl"] = d["agentrl"]
                for c in d.get("choices") or []:
                    i = int(c.get("index", 0))
                    acc = choices.setdefault(
                        i, {"index": i, "text": "", "token_ids": [], "lp": [], "ext": None}
                    )
                    delta = c.get("text") or ""
                    acc["text"] += delta
                    if delta and on_text is not None:
                        on_text(i, delta)
                    acc["token_ids"] += c.get("token_ids") or []  # vLLM's return_token_ids
                    acc["lp"] += (c.get("logprobs") or {}).get("token_logprobs") or []
                    for key in ("finish_reason", "stop_reason", "prompt_token_ids", "agentrl"):
                        if c.get(key) is not None:
                            acc[key] = c[key]
        out = []
        for i in sorted(choices):
            acc = choices[i]
            choice = {k: v for k, v in acc.items() if k not in ("lp", "ext")}
            choice["logprobs"] = {"token_logprobs": acc["lp"]}
            if not choice["token_ids"]:
                del choice["token_ids"]
            out.append(choice)
        return {**top, "choices": out}

    @staticmethod
    def _generation(prompt: str, choice: dict[str, Any], version: int) -> Generation:
        ext = choice.get("agentrl") or {}
        lp = choice.get("logprobs") or {}
        token_ids = ext.get("token_ids", choice.get("token_ids"))
        prompt_ids = ext.get("prompt_token_ids", choice.get("prompt_token_ids"))
        logprobs = ext.get("logprobs", lp.get("token_logprobs"))
        if token_ids is None:
            raise BackendError(
                "/completions: the server returned no token ids (agentrl extension or vLLM "
                "return_token_ids)"
            )
        if logprobs is None or len(logprobs) != len(token_ids):
            raise BackendError("/completions: log-probs missing or not one per token")
        stop = ext.get("stop")
        if stop is None and isinstance(choice.get("stop_reason"), str):
            stop = choice["stop_reason"]  # vLLM: the matched stop string
        reason = ext.get("finish_reason") or choice.get("finish_reason") or "length"
        if reason == "stop" and stop is None:
            reason = "eos"  # OpenAI's "stop" covers the end token too
        return Generation(
            prompt=prompt,
            text=choice.get("text", ""),
            prompt_ids=list(prompt_ids or []),
            token_ids=[int(t) for t in token_ids],
            logprobs=[float(x) for x in logprobs],
            finish_reason=reason,
            version=int(ext.get("policy_version", version)),
            stop=stop,
        )

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Not possible over this API: the server's weights are its own."""
        raise NotImplementedError(
            "OpenAIBackend cannot push weights to the server; reload the server's policy "
            "(or use LocalBackend) to change them"
        )

    async def aclose(self) -> None:
        """Closes the pooled connections."""
        if self._client is not None:
            client, self._client = self._client, None
            if self._loop is asyncio.get_running_loop():
                await client.close()
