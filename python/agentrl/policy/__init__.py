"""The torch policy of agentrl: the built-in small GPT, Hugging Face causal LMs, batched
sampling with a KV cache, generation backends (local and OpenAI-compatible HTTP) and the
``agentrl serve`` server."""

from __future__ import annotations

from agentrl.policy.backends import (
    BackendError,
    GenerationBackend,
    LocalBackend,
    OpenAIBackend,
)
from agentrl.policy.gpt import GPTConfig, KVCache, TinyGPT
from agentrl.policy.policy import Policy, default_device, default_dtype
from agentrl.policy.sampling import Generation, SamplingParams
from agentrl.policy.tokenizer import CharTokenizer, Tokenizer

__all__ = [
    "BackendError",
    "CharTokenizer",
    "GPTConfig",
    "Generation",
    "GenerationBackend",
    "KVCache",
    "LocalBackend",
    "OpenAIBackend",
    "Policy",
    "SamplingParams",
    "TinyGPT",
    "Tokenizer",
    "default_device",
    "default_dtype",
]
