"""GRPO losses as pure tensor functions.

Shapes: ``B`` sequences (completions) of at most ``T`` completion tokens, right-padded.
Per-token tensors are ``[B, T]``; ``token_mask`` is true on real completion tokens.

Group Relative Policy Optimisation (DeepSeekMath) samples ``n`` completions per prompt and
uses the reward of each relative to its group as the advantage of all of its tokens; no
value network. The pieces here:

* :func:`group_advantages` - ``r - mean(group)``, optionally divided by the group's std.
  Episodes whose reward is masked (infrastructure failure) get advantage 0 and are left out
  of the group statistics.
* :func:`policy_loss` - the clipped surrogate with asymmetric clipping ``eps_low`` /
  ``eps_high`` (DAPO's clip-higher), AReaL's decoupled importance correction for stale
  tokens, an optional k3 KL penalty to a frozen reference, and three ways to aggregate the
  per-token terms: ``"seq_mean"`` (GRPO), ``"token_mean"`` (DAPO) and ``"dr_grpo"`` (a
  constant normaliser, Dr. GRPO).

Decoupled objective (AReaL): the *behaviour* policy that sampled a token may be a few
versions older than the weights at the start of the update (the *proximal* policy). The
per-token term is ``w * min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` with
``r = pi_theta / pi_prox`` (the trust region is around the proximal policy) and the
importance weight ``w = min(pi_prox / pi_behav, is_cap)`` (detached) correcting for the
samples coming from the behaviour policy. Without behaviour log-probs ``w = 1``: plain PPO
clipping against ``prox_logp``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.train.config import AGGREGATIONS, GRPOConfig

__all__ = [
    "AGGREGATIONS",
    "LossStats",
    "aggregate",
    "group_advantages",
    "k3_kl",
    "policy_loss",
]

_DEFAULTS = GRPOConfig()


def group_advantages(
    rewards: Tensor,
    mask: Tensor | None = None,
    *,
    scale_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages.

    ``rewards``: ``[G, n]``, one row per group (prompt), one column per completion.
    ``mask``: ``[G, n]`` bool, false for episodes whose reward is masked: their advantage
    is 0 and they are excluded from the group's mean and std. Returns ``[G, n]``:
    ``r - mean`` over the valid entries of the row, divided by ``std + eps`` (the sample
    std, ``n_valid - 1`` in the denominator) when ``scale_std``. A row with fewer than two
    valid entries, or whose valid rewards are all equal, gets zeros: such a group carries
    no signal.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, group_size], got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float32)
    m = torch.ones_like(r, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    if m.shape != r.shape:
        raise ValueError(f"mask shape {tuple(m.shape)} differs from rewards {tuple(r.shape)}")
    mf = m.to(r.dtype)
    r = torch.where(m, r, torch.zeros_like(r))  # masked rewards may be NaN
    n = mf.sum(dim=1, keepdim=True)
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    centred = (r - mean) * mf
    if scale_std:
        var = (centred**2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
        centred = centred / (var.sqrt() + eps)
    # Fewer than two valid entries or zero spread: exactly zero (no rounding residue).
    spread = (centred.abs() * mf).amax(dim=1, keepdim=True) > 0
    keep = (n >= 2) & spread
    return torch.where(keep, centred, torch.zeros_like(centred))


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of ``KL(pi_theta || pi_ref)`` (Schulman):
    ``exp(ref - logp) - (ref - logp) - 1``; non-negative, unbiased under samples of
    ``pi_theta``, and differentiable in ``logp``."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(
    per_token: Tensor,
    token_mask: Tensor,
    agg: str,
    *,
    n_seqs: float | None = None,
    n_tokens: float | None = None,
    max_new_tokens: int | None = None,
) -> Tensor:
    """Reduces ``[B, T]`` per-token terms to a scalar.

    ``"seq_mean"``: mean over each sequence's tokens, then sum over sequences / ``n_seqs``.
    ``"token_mean"``: sum over all tokens / ``n_tokens`` (DAPO). ``"dr_grpo"``: sum over all
    tokens / (``max_new_tokens * n_seqs``) (Dr. GRPO: no length bias). ``n_seqs`` and
    ``n_tokens`` default to this batch's counts of sequences with at least one token and
    of tokens; under gradient accumulation pass the counts of the whole batch, so that the
    micro-batch losses add up to the loss of the whole batch.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    mf = token_mask.to(per_token.dtype)
    lengths = mf.sum(dim=1)
    if n_seqs is None:
        n_seqs = float((lengths > 0).sum().item())
    if n_tokens is None:
        n_tokens = float(lengths.sum().item())
    total = per_token * mf
    if agg == "seq_mean":
        per_seq = total.sum(dim=1) / lengths.clamp(min=1)
        return per_seq.sum() / max(n_seqs, 1.0)
    if agg == "token_mean":
        return total.sum() / max(n_tokens, 1.0)
    if max_new_tokens is None or max_new_tokens < 1:
        raise ValueError("agg='dr_grpo' needs max_new_tokens >= 1 (the constant normaliser)")
    return total.sum() / (max_new_tokens * max(n_seqs, 1.0))


@dataclass
class LossStats:
    """Diagnostics of one :func:`policy_loss` call (floats, over the real tokens)."""

    clip_fraction: float
    """Share of tokens whose ratio was clipped (the clipped branch was the minimum)."""
    mean_ratio: float
    """Mean of ``pi_theta / pi_prox``."""
    mean_is_weight: float
    """Mean of the (capped) importance weight ``pi_prox / pi_behav``."""
    is_capped_fraction: float
    """Share of tokens whose importance weight hit ``is_cap``."""
    kl: float
    """Mean k3 KL to the reference (0 without one)."""
    tokens: int
    """Real tokens in the batch."""


def policy_loss(
    logp: Tensor,
    advantages: Tensor,
    token_mask: Tensor,
    *,
    prox_logp: Tensor | None = None,
    behav_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    eps_low: float = _DEFAULTS.eps_low,
    eps_high: float = _DEFAULTS.eps_high,
    is_cap: float | None = _DEFAULTS.is_cap or None,
    kl_coef: float = _DEFAULTS.kl_coef,
    agg: str = _DEFAULTS.loss_agg,
    seq_mask: Tensor | None = None,
    n_seqs: float | None = None,
    n_tokens: float | None = None,
    max_new_tokens: int | None = None,
) -> tuple[Tensor, LossStats]:
    """The GRPO loss (to minimise) of a batch and its diagnostics.

    ``logp``: ``[B, T]`` log-probs of the completion tokens under the weights being trained
    (differentiable). ``advantages``: ``[B]`` (one per sequence, e.g. a flattened
    :func:`group_advantages`) or ``[B, T]``. ``prox_logp``: log-probs under the weights at
    the start of the update (default: ``logp`` detached, i.e. a single gradient step per
    batch, where the ratio is 1). ``behav_logp``: log-probs the generator reported when it
    sampled the tokens; with it, each token is weighted by ``min(exp(prox - behav),
    is_cap)`` (``is_cap=None``: uncapped). ``ref_logp`` with ``kl_coef > 0`` adds
    ``kl_coef * k3_kl``. ``seq_mask``: ``[B]`` bool, false for sequences that must not
    count at all (masked rewards): they add nothing, not even to the normalisers.
    Aggregation: see :func:`aggregate`. The defaults of ``eps_low``, ``eps_high``,
    ``is_cap``, ``kl_coef`` and ``agg`` are those of
    :class:`~agentrl.train.config.GRPOConfig` (``loss_agg``; its ``is_cap`` 0 is None here).
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must be [batch, tokens], got shape {tuple(logp.shape)}")
    if token_mask.shape != logp.shape:
        raise ValueError("token_mask must have the shape of logp")
    for name, t in (("prox_logp", prox_logp), ("behav_logp", behav_logp), ("ref_logp", ref_logp)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} must have the shape of logp")
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError("eps_low and eps_high must be non-negative")
    if is_cap is not None and not is_cap > 0:
        raise ValueError("is_cap must be positive or None")
    if kl_coef and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp")
    mask = token_mask.to(torch.bool)
    if seq_mask is not None:
        mask = mask & seq_mask.to(torch.bool).unsqueeze(1)
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    adv = adv.expand_as(logp)

    prox = logp.detach() if prox_logp is None else prox_logp.detach()
    ratio = torch.exp(logp - prox)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    surr1, surr2 = ratio * adv, clipped * adv
    surrogate = torch.minimum(surr1, surr2)
    if behav_logp is not None:
        w = torch.exp(prox - behav_logp.detach())
        capped = w >= is_cap if is_cap is not None else torch.zeros_like(mask)
        if is_cap is not None:
            w = torch.clamp(w, max=is_cap)
    else:
        w = torch.ones_like(prox)
        capped = torch.zeros_like(mask)
    per_token = -(w * surrogate)
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp.detach())
        if kl_coef:
            per_token = per_token + kl_coef * kl
    loss = aggregate(
        per_token, mask, agg, n_seqs=n_seqs, n_tokens=n_tokens, max_new_tokens=max_new_tokens
    )

    with torch.no_grad():
        mf = mask.to(logp.dtype)
        nt = float(mf.sum().item())
        denom = max(nt, 1.0)
        was_clipped = (surr2 < surr1) & mask
        stats = LossStats(
            clip_fraction=float(was_clipped.sum().item()) / denom,
            mean_ratio=float((ratio * mf).sum().item()) / denom,
            mean_is_weight=float((w * mf).sum().item()) / denom,
            is_capped_fraction=float((capped & mask).sum().item()) / denom,
            kl=0.0 if kl is None else float((kl * mf).sum().item()) / denom,
            tokens=int(nt),
        )
    return loss, stats
