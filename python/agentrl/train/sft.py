"""Supervised warm start: next-token cross-entropy on the completion tokens of
``(prompt, completion)`` pairs, AdamW with linear warm-up and cosine decay."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentrl.train.config import SFTConfig

__all__ = ["SFTConfig", "supervised_warm_start"]


def _lr_at(step: int, c: SFTConfig) -> float:
    if step < c.warmup:
        return c.lr * (step + 1) / c.warmup
    rest = max(1, c.steps - c.warmup)
    return c.lr * 0.5 * (1.0 + math.cos(math.pi * (step - c.warmup) / rest))


def supervised_warm_start(
    policy: Any,
    pairs: Sequence[tuple[str, str]],
    config: SFTConfig | None = None,
    *,
    on_step: Callable[[int, float, float], None] | None = None,
) -> list[float]:
    """Fits ``policy`` (an :class:`agentrl.policy.Policy`) to ``pairs`` in place; returns
    the loss of each step (mean negative log-likelihood per completion token).

    Each step draws ``batch_size`` pairs (epochs of seeded shuffles). The prompt is encoded
    as generation sees it (``tokenizer.encode_prompt``), the completion as plain tokens.
    ``on_step(step, loss, seconds_so_far)`` is called after every step.
    """
    c = config or SFTConfig()
    if not pairs:
        raise ValueError("supervised_warm_start needs at least one (prompt, completion) pair")
    tok = policy.tokenizer
    encoded = [(tok.encode_prompt(p), tok.encode(cpl)) for p, cpl in pairs]
    for i, (_, cpl) in enumerate(encoded):
        if not cpl:
            raise ValueError(f"pair {i} has an empty completion")
    rng = random.Random(0 if c.seed is None else c.seed)
    order: list[int] = []
    model = policy.model
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, betas=(0.9, 0.98), weight_decay=c.weight_decay)
    losses: list[float] = []
    t0 = time.perf_counter()
    model.train()
    with policy.lock:
        for step in range(c.steps):
            while len(order) < c.batch_size:
                idx = list(range(len(encoded)))
                rng.shuffle(idx)
                order += idx
            batch = [encoded[i] for i in order[: c.batch_size]]
            del order[: c.batch_size]
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, c)
            lps = policy.token_logprobs([b[0] for b in batch], [b[1] for b in batch])
            loss = -torch.cat(lps).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if c.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, c.grad_clip)
            opt.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(step, losses[-1], time.perf_counter() - t0)
    return losses
