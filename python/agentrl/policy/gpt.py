"""The built-in model: a small GPT in plain torch (pre-LN, learned positions, tied weights).

:class:`TinyGPT` takes an optional :class:`KVCache`: the keys and values of every layer are
written into preallocated buffers, so that generation feeds one token per step. Left padding
is handled by ``attention_mask`` (keys that are padding are never attended to) and
``position_ids`` (a padded sequence gets the positions it would have alone).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GPTConfig", "KVCache", "TinyGPT"]


@dataclass
class GPTConfig:
    """Shape of a :class:`TinyGPT`."""

    vocab_size: int = 259
    """Number of token ids (259 = the bytes and three specials of ``CharTokenizer``)."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide ``d_model``."""
    d_model: int = 128
    """Width of the residual stream."""
    max_seq_len: int = 256
    """Longest sequence (prompt and completion) the learned position table covers."""
    dropout: float = 0.0
    """Dropout on embeddings, attention output and MLP output while training."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {v!r}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"GPTConfig.n_head ({self.n_head}) must divide d_model ({self.d_model})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")

    def to_dict(self) -> dict[str, int | float]:
        """The fields as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> GPTConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"GPTConfig: unknown fields {sorted(unknown)}")
        return cls(**d)  # type: ignore[arg-type]


class KVCache:
    """Keys and values of every layer for a batch, in preallocated buffers.

    ``length`` is the number of positions written so far; each forward call with the cache
    writes its ``T`` new positions at ``length`` and advances it.
    """

    def __init__(
        self,
        config: GPTConfig,
        batch_size: int,
        max_len: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        head_dim = config.d_model // config.n_head
        shape = (config.n_layer, batch_size, config.n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.max_len = max_len

    def select(self, rows: Tensor) -> None:
        """Keeps only the batch rows ``rows`` (a 1-D index tensor), in that order."""
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)


class _Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.n_head = c.n_head
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.out = nn.Linear(4 * c.d_model, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(
        self, x: Tensor, mask: Tensor | None, cache: KVCache | None, layer: int, start: int
    ) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            cache.k[layer, :, :, start : start + t] = k
            cache.v[layer, :, :, start : start + t] = v
            k = cache.k[layer, :, :, : start + t]
            v = cache.v[layer, :, :, : start + t]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyGPT(nn.Module):
    """Decoder-only transformer: token + learned position embeddings, pre-LN blocks, final
    LayerNorm, output projection tied to the token embedding."""

    def __init__(self, config: GPTConfig | None = None) -> None:
        super().__init__()
        self.config = c = config or GPTConfig()
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.max_seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "out.weight")):  # GPT-2's scaled residual init
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty cache for ``batch_size`` sequences of at most ``max_len`` positions, on
        the model's device and dtype."""
        w = self.tok.weight
        return KVCache(self.config, batch_size, max_len, device=w.device, dtype=w.dtype)

    def forward(
        self,
        ids: Tensor,
        *,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Logits ``(B, T, vocab_size)`` for token ids ``(B, T)``.

        ``attention_mask`` ``(B, S)`` marks with 1 the real (not padding) keys of all ``S``
        positions so far (cached ones included: ``S = cache.length + T``); None means all
        real. ``position_ids`` ``(B, T)`` default to ``cache.length + arange(T)``. With a
        ``cache``, the new keys and values are appended to it.
        """
        if ids.dim() != 2:
            raise ValueError(f"TinyGPT: ids must be (batch, time), got shape {tuple(ids.shape)}")
        b, t = ids.shape
        start = cache.length if cache is not None else 0
        total = start + t
        if cache is not None and total > cache.max_len:
            raise ValueError(f"TinyGPT: cache of {cache.max_len} positions is full")
        if position_ids is None:
            position_ids = torch.arange(start, total, device=ids.device).expand(b, t)
        if t > 1 and int(position_ids.max()) >= self.config.max_seq_len:  # one sync per prefill
            raise ValueError(
                f"TinyGPT: position {int(position_ids.max())} is beyond "
                f"max_seq_len={self.config.max_seq_len}"
            )
        allowed: Tensor | None = None  # None: plain causal attention from position 0
        if attention_mask is not None or start > 0:
            q_pos = torch.arange(start, total, device=ids.device)
            k_pos = torch.arange(total, device=ids.device)
            allowed = k_pos[None, :] <= q_pos[:, None]  # (T, S) causal
        if attention_mask is not None:
            if attention_mask.shape != (b, total):
                raise ValueError(
                    f"TinyGPT: attention_mask must be {(b, total)}, "
                    f"got {tuple(attention_mask.shape)}"
                )
            own = k_pos[None, :] == q_pos[:, None]  # a padding query attends to itself only
            allowed = allowed & (attention_mask[:, None, :].bool() | own)
            allowed = allowed[:, None]  # (B, 1, T, S)
        x = self.drop(self.tok(ids) + self.pos(position_ids))
        for i, block in enumerate(self.blocks):
            x = block(x, allowed, cache, i, start)
        if cache is not None:
            cache.length = total
        return self.head(self.ln_f(x))
