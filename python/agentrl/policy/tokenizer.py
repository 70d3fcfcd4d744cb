"""Tokenizers of the policy: the byte-level :class:`CharTokenizer` of the built-in model.

Every tokenizer the policy uses exposes the same small interface (:class:`Tokenizer`):
``encode``/``decode``, ``encode_prompt`` (the ids a prompt starts generation from, with the
tokenizer's own begin-of-sequence convention) and the ids ``pad_id``, ``bos_id``, ``eos_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["CharTokenizer", "Tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """What :class:`agentrl.policy.Policy` needs of a tokenizer."""

    pad_id: int
    bos_id: int | None
    eos_id: int | None
    vocab_size: int

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_prompt(self, text: str) -> list[int]: ...


class CharTokenizer:
    """Byte-level tokenizer: ids 0..255 are the UTF-8 bytes, then three special tokens.

    ``pad_id = 256``, ``bos_id = 257``, ``eos_id = 258``, ``vocab_size = 259``. Any text
    round-trips: ``decode(encode(s)) == s``. Prompts start with BOS.
    """

    pad_id: int = 256
    bos_id: int = 257
    eos_id: int = 258
    vocab_size: int = 259

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """UTF-8 bytes of ``text``, with BOS first and/or EOS last when asked."""
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer.encode: text must be str, not {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        if bos:
            ids.insert(0, self.bos_id)
        if eos:
            ids.append(self.eos_id)
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """The ids generation starts from: BOS, then the bytes of ``text``."""
        return self.encode(text, bos=True)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special ids are skipped, invalid UTF-8 becomes U+FFFD."""
        out = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                out.append(i)
            elif not 256 <= i < self.vocab_size:
                raise ValueError(
                    f"CharTokenizer.decode: id {i} is outside 0..{self.vocab_size - 1}"
                )
        return out.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "CharTokenizer()"
