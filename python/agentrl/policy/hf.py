"""Hugging Face causal LMs from a local directory (``transformers``; never downloads)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["HFTokenizer", "load_hf"]


class HFTokenizer:
    """A ``transformers`` tokenizer behind the :class:`~agentrl.policy.tokenizer.Tokenizer`
    interface. Prompts are encoded with the tokenizer's own special tokens (a Llama
    tokenizer adds BOS, a GPT-2 one adds nothing)."""

    def __init__(self, tokenizer: Any) -> None:
        self.hf = tokenizer
        self.bos_id: int | None = tokenizer.bos_token_id
        self.eos_id: int | None = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = self.eos_id if self.eos_id is not None else 0
        self.pad_id: int = int(pad)
        self.vocab_size: int = len(tokenizer)

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of ``text`` without the tokenizer's automatic specials; BOS/EOS on request."""
        if not isinstance(text, str):
            raise TypeError(f"HFTokenizer.encode: text must be str, not {type(text).__name__}")
        ids = list(self.hf(text, add_special_tokens=False)["input_ids"])
        if bos:
            if self.bos_id is None:
                raise ValueError("HFTokenizer.encode: the tokenizer has no BOS token")
            ids.insert(0, self.bos_id)
        if eos:
            if self.eos_id is None:
                raise ValueError("HFTokenizer.encode: the tokenizer has no EOS token")
            ids.append(self.eos_id)
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a prompt, with the tokenizer's default special tokens."""
        if not isinstance(text, str):
            raise TypeError(f"HFTokenizer.encode: text must be str, not {type(text).__name__}")
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens skipped."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def save_pretrained(self, path: str | Path) -> None:
        """Saves the wrapped tokenizer."""
        self.hf.save_pretrained(str(path))

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size})"


def load_hf(path: str | Path, *, dtype: torch.dtype) -> tuple[nn.Module, HFTokenizer, list[int]]:
    """The model, its tokenizer and its end-of-sequence ids from local directory ``path``."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("Hugging Face models need transformers: pip install 'agentrl[hf]'") from e
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{str(path)!r} is not a Hugging Face model directory (no config.json)")
    tok = HFTokenizer(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    model.eval()
    eos: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        e = getattr(source, "eos_token_id", None)
        eos += [e] if isinstance(e, int) else list(e or [])
    if tok.eos_id is not None:
        eos.append(tok.eos_id)
    return model, tok, sorted(set(eos))
