"""Incremental text of a completion as its tokens arrive (the ``stream=true`` responses).

:class:`TextStream` turns token ids into text deltas the way vLLM's incremental detokenizer
does: it decodes a short window of ids (so a tokenizer that drops a leading space when a
sequence starts mid-word still gets the space right) and holds back text that is not final
yet: an incomplete UTF-8 sequence (U+FFFD at the end) and, when the request has stop
strings, the last ``len(longest stop) - 1`` characters and anything from a stop string on
(the final text is cut before it). What was sent is always a prefix of the final text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TextStream"]


class TextStream:
    """The text deltas of one completion."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this are already text
        self.text = ""  # decoded so far (final up to the stop cut)
        self.sent = 0  # characters of text sent

    def push(self, token_id: int, logprob: float) -> str:
        """Adds a token; returns the text that can be sent now (often ``""``)."""
        self.ids.append(token_id)
        self.logprobs.append(logprob)
        dec = self.tokenizer.decode
        before = dec(self.ids[self._prefix : self._read])
        after = dec(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
        safe = len(self.text)
        if self.stop:
            safe -= self._hold
            for s in self.stop:
                at = self.text.find(s, max(0, self.sent - len(s)))
                if at >= 0:
                    safe = min(safe, at)
        return self._take(safe)

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the completion's text) after what was sent."""
        sent = self.text[: self.sent]
        self.sent = len(sent)
        if not final_text.startswith(sent):  # a tokenizer whose pieces do not add up
            return ""
        self.text = final_text
        return self._take(len(final_text))

    def _take(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent : upto]
        self.sent = upto
        return out
