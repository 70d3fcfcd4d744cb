"""Sampling parameters, the result of a generation, and the per-step sampler.

Log-probabilities: ``Generation.logprobs[i]`` is the log-probability of ``token_ids[i]``
under the distribution it was sampled from *including* temperature scaling
(``log_softmax(logits / T)``) but *without* top-p truncation, so that the trainer can
recompute the same quantity under new weights with ``Policy.token_logprobs(...,
temperature=T)``. Greedy decoding (``temperature == 0``) reports the temperature-1
log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["Generation", "SamplingParams", "sample_next", "top_p_mask"]

FINISH_REASONS = ("stop", "length", "eos")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a completion."""

    max_new_tokens: int = 64
    """Most tokens generated per prompt (the EOS or stop-completing token included)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: sample among the most likely tokens whose cumulative probability
    first reaches ``top_p`` (the most likely token is always kept); 1 disables it."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion. The completion's text is cut before the first one;
    its ``token_ids``/``logprobs`` end with the token that completed it."""
    seed: int | None = None
    """Seed of the sampling generator: the same seed, prompts and weights give the same
    completions. None: a fresh random seed."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}"
            )
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise TypeError(
                f"SamplingParams.temperature must be a number, got {self.temperature!r}"
            )
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(
                    f"SamplingParams.stop: stop strings must be non-empty str, got {s!r}"
                )
        if self.seed is not None and not isinstance(self.seed, int):
            raise TypeError(f"SamplingParams.seed must be an int or None, got {self.seed!r}")


@dataclass
class Generation:
    """One completion of one prompt."""

    prompt: str
    """The prompt as given."""
    text: str
    """The completion's text: without the EOS token, cut before the stop string."""
    prompt_ids: list[int]
    """The ids the model was conditioned on (with the tokenizer's BOS convention)."""
    token_ids: list[int]
    """The generated ids, including a final EOS or stop-completing token."""
    logprobs: list[float]
    """Log-probability of each of ``token_ids`` under the sampled distribution (temperature
    applied, top-p not; see the module docstring)."""
    finish_reason: str
    """``"stop"`` (a stop string), ``"eos"`` (the EOS token) or ``"length"``
    (``max_new_tokens`` or the model's context length)."""
    version: int
    """Policy version whose weights generated it."""
    stop: str | None = None
    """The stop string that ended it, if any."""
    metadata: dict[str, object] = field(default_factory=dict)
    """Free-form extras (a backend may add timing or server fields)."""

    @property
    def num_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)


def top_p_mask(probs: Tensor, top_p: Tensor) -> Tensor:
    """Boolean mask ``(B, V)`` of the tokens nucleus sampling keeps.

    ``probs`` ``(B, V)`` are probabilities, ``top_p`` ``(B,)`` the thresholds. A token is kept
    when the probability mass of the strictly more likely tokens (ties broken by sort order)
    is below ``top_p``: the smallest set whose mass reaches ``top_p``. The most likely token
    is always kept.
    """
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted = before < top_p[:, None]
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sample_next(
    logits: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    generator: torch.Generator | None,
    *,
    all_greedy: bool | None = None,
    use_top_p: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Samples one token per row: returns ``(tokens (B,), logprobs (B,))``.

    ``logits`` ``(B, V)``; ``temperature`` and ``top_p`` ``(B,)`` float tensors on the same
    device. Rows with temperature 0 take the argmax and report the temperature-1 log-prob;
    other rows sample from ``softmax(logits / T)`` restricted to the top-p nucleus and report
    the log-prob under ``softmax(logits / T)``. ``all_greedy`` and ``use_top_p``, when the
    caller knows them, spare a device synchronisation each.
    """
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    if all_greedy is None:
        all_greedy = bool(greedy.all())
    if use_top_p is None:
        use_top_p = bool((top_p < 1.0).any())
    if all_greedy:
        tokens = logp.argmax(-1)
    else:
        probs = logp.exp()
        if use_top_p:
            probs = probs * top_p_mask(probs, top_p)
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        tokens = torch.where(greedy, logp.argmax(-1), sampled)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


class StopMatcher:
    """Finds the earliest stop string in a growing completion text."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, new_from: int) -> tuple[int, str] | None:
        """Earliest ``(index, stop)`` with a stop string that ends after ``new_from``
        (the length of the text already checked), or None."""
        if not self.stops:
            return None
        lo = max(0, new_from - self.longest + 1)
        best: tuple[int, str] | None = None
        for s in self.stops:
            i = text.find(s, lo)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best
