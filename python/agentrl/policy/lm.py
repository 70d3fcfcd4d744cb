"""One forward interface over the built-in model and Hugging Face causal LMs.

Generation and scoring in :class:`agentrl.policy.Policy` go through :func:`forward`, so
both kinds of model share one code path: the built-in model keeps its keys and values in
a preallocated :class:`~agentrl.policy.gpt.KVCache`, a Hugging Face model in its own
``past_key_values`` (a ``DynamicCache``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from agentrl.policy.gpt import KVCache, TinyGPT

__all__ = ["context_length", "forward", "new_cache", "select_rows"]


def context_length(model: nn.Module) -> int | None:
    """Longest sequence the model takes (None when it does not say)."""
    if isinstance(model, TinyGPT):
        return model.config.max_seq_len
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) else None


def new_cache(model: nn.Module, batch_size: int, max_len: int) -> Any:
    """An empty cache for generation (None for a Hugging Face model: it makes its own)."""
    if isinstance(model, TinyGPT):
        return model.new_cache(batch_size, max_len)
    return None


def forward(
    model: nn.Module,
    ids: Tensor,
    attention_mask: Tensor | None,
    position_ids: Tensor | None,
    cache: Any = None,
    *,
    use_cache: bool = False,
    last_only: bool = False,
) -> tuple[Tensor, Any]:
    """Logits ``(B, T, V)`` and the updated cache.

    ``attention_mask`` ``(B, S)`` covers the cached positions and the new ones. With
    ``use_cache`` False no cache is made or returned (a plain forward, as in training).
    ``last_only`` lets a model that can compute the logits of the last position only
    (``(B, 1, V)``) do so.
    """
    if isinstance(model, TinyGPT):
        if use_cache and cache is None:
            raise ValueError("forward: the built-in model needs a cache from new_cache()")
        logits = model(
            ids,
            cache=cache if use_cache else None,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        return logits, cache if use_cache else None
    cache_arg, keep_arg = _hf_arguments(type(model))
    kwargs: dict[str, Any] = {cache_arg: cache if use_cache else None}
    if last_only and keep_arg:
        kwargs["logits_to_keep"] = 1
    out = model(
        input_ids=ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        **kwargs,
    )
    if not use_cache:
        return out.logits, None
    new = getattr(out, "cache", None)
    return out.logits, new if new is not None else out.past_key_values


@functools.cache
def _hf_arguments(cls: type) -> tuple[str, bool]:
    """Name of the cache argument of a Hugging Face model class (``cache`` in recent
    transformers, ``past_key_values`` before) and whether it takes ``logits_to_keep``."""
    params = inspect.signature(cls.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "logits_to_keep" in params


def select_rows(cache: Any, rows: Tensor) -> Any:
    """The cache restricted to batch ``rows`` (used to drop finished sequences)."""
    if isinstance(cache, KVCache):
        cache.select(rows)
        return cache
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(rows)
        return cache
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(rows)
        return cache
    raise TypeError(f"select_rows: cannot select rows of a {type(cache).__name__}")


def model_dtype(model: nn.Module) -> torch.dtype:
    """Dtype of the model's first floating-point parameter."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
