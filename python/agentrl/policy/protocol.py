"""Request and response models of ``agentrl serve`` (pydantic), OpenAI's shapes as vLLM and
SGLang serve them, plus the ``agentrl`` extension objects.

Requests are validated strictly (``"1"`` is not a number, ``true`` is not an integer); fields
this server does not know are accepted and ignored, as OpenAI-compatible servers do (clients
send server-specific options such as vLLM's ``return_token_ids``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorResponse",
    "HealthResponse",
    "ModelList",
]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Request):
    include_usage: bool = False
    """With ``stream=true``: a last chunk with empty ``choices`` and the request's ``usage``."""


def _check_stop(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return v
    raise ValueError("stop must be a string or a list of strings")


class _Sampling(_Request):
    model: str | None = None
    """The served model's id (``GET /v1/models``); omitted: the served model."""
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    """Completions per prompt."""
    stop: str | list[str] | None = None
    seed: int | None = None
    """Runs the request in a batch of its own, so the result depends only on the seed."""
    stream: bool = False
    """Server-sent events: ``data: {chunk}`` lines, then ``data: [DONE]``."""
    stream_options: StreamOptions | None = None

    _stop = field_validator("stop", mode="before")(_check_stop)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    """A string, a list of strings, token ids, or lists of token ids."""
    max_tokens: int = 16
    logprobs: int | None = None
    """Any integer: the sampled tokens' log-probs (``top_logprobs`` is always null)."""
    echo: bool = False
    """Not supported (true is refused)."""
    suffix: str | None = None
    """Not supported (refused)."""
    best_of: int | None = None
    """Only ``best_of == n`` (or null) is accepted."""

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, str):
            return v
        if isinstance(v, list) and v:
            if all(isinstance(p, str) for p in v) or all(type(t) is int for t in v):
                return v
            if all(isinstance(p, list) and all(type(t) is int for t in p) for p in v):
                return v
        raise ValueError(
            "prompt must be a string, a list of strings, token ids or lists of token ids"
        )


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: str
    """``system``, ``user``, ``assistant``, ``tool``, ... (passed to the chat template)."""
    content: str | list[TextPart] | None = None
    """Text, or a list of ``{"type": "text", "text": ...}`` parts (joined)."""

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any) -> Any:
        if isinstance(v, list):
            for part in v:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(
                        f"content parts of type {kind!r} are not supported (text only)"
                    )
        return v

    def text(self) -> str:
        """The content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    """Most tokens per completion (``max_completion_tokens`` is the newer name); default:
    the server's ``chat_max_tokens`` (still capped by the model's context)."""
    max_completion_tokens: int | None = None
    logprobs: bool = False
    """The sampled tokens' log-probs in ``choices[].logprobs.content``."""
    top_logprobs: int | None = None
    """Only 0 or null: alternatives are not computed."""


# ---------------------------------------------------------------------- responses


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(_Response):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(_Response):
    """Every error status: OpenAI's error object."""

    error: ErrorBody


class HealthResponse(_Response):
    status: Literal["ok"]
    policy_version: int


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class AgentrlChoice(_Response):
    """The ``agentrl`` extension of each choice: what an RL trainer needs."""

    token_ids: list[int]
    prompt_token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each of ``token_ids`` under the sampled distribution."""
    finish_reason: Literal["stop", "eos", "length"]
    stop: str | None
    policy_version: int


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Response):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: None = None
    text_offset: list[int]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None
    agentrl: AgentrlChoice | None = None


class CompletionResponse(_Response):
    """``POST /v1/completions`` (and each chunk of its stream, with text deltas)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[Any]


class ChatLogprobs(_Response):
    content: list[TokenLogprob]


class AssistantMessage(_Response):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length"]
    agentrl: AgentrlChoice


class ChatCompletionResponse(_Response):
    """``POST /v1/chat/completions`` without ``stream`` (the stream sends
    ``chat.completion.chunk`` objects with ``delta`` in place of ``message``)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
