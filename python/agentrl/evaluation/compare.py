"""Comparisons of a program's stdout with the expected output (done on the host)."""

from __future__ import annotations

import math

__all__ = ["outputs_match"]


def _norm_exact(text: str) -> str:
    return text.replace("\r\n", "\n").rstrip("\n")


def _float_token_match(got: str, want: str, tol: float) -> bool:
    if got == want:
        return True
    try:
        a, b = float(got), float(want)
    except ValueError:
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol * max(1.0, abs(b))


def outputs_match(got: str, want: str, mode: str = "exact", float_tol: float = 1e-6) -> bool:
    """Whether stdout ``got`` matches ``want``.

    * ``"exact"``: equal after turning CRLF into LF and dropping trailing newlines.
    * ``"whitespace"``: the same whitespace-separated tokens.
    * ``"float"``: the same tokens, where two numbers match when they differ by at most
      ``float_tol`` (absolute below 1, relative above); NaN matches only NaN.
    """
    if not isinstance(got, str) or not isinstance(want, str):
        raise TypeError("outputs_match compares two str")
    if mode == "exact":
        return _norm_exact(got) == _norm_exact(want)
    if mode == "whitespace":
        return got.split() == want.split()
    if mode == "float":
        a, b = got.split(), want.split()
        return len(a) == len(b) and all(
            _float_token_match(x, y, float_tol) for x, y in zip(a, b, strict=True)
        )
    raise ValueError(f"unknown comparison mode {mode!r} (exact, whitespace or float)")
