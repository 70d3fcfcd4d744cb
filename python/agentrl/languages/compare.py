"""Comparing a program's stdout with the expected output, as the judges in the field do.

Each mode follows one project's rule (restated here from its source, not copied):

* ``exact``: equal after turning CRLF into LF and dropping trailing newlines (agentrl's own,
  the Evaluator's default).
* ``whitespace``: the same whitespace-separated tokens (``str.split()``), whatever the spacing
  and line breaks.
* ``float``: ``whitespace``, except that two numeric tokens match when they differ by at most
  ``float_tol`` (absolute below 1, relative above; NaN matches only NaN); agentrl's own.
* ``sandboxfusion``: SandboxFusion's ``check_stdio_test_case`` (bytedance/SandboxFusion,
  ``sandbox/datasets/common.py``): both outputs are stripped and split on ``\\n``; the line
  counts must agree (a lone trailing empty line on one side is dropped); lines are compared
  lower-cased (its ``lower_cmp=True`` default) after stripping each; two lines that differ but
  both parse as a Python ``float`` match when ``|got - want| / max(|want|, 1e-10) < 1e-5`` (a
  relative tolerance of 1e-5, against the expected value).
* ``codecontests``: DeepMind CodeContests' ``OutputsMatch`` (google-deepmind/code_contests,
  ``execution/tester_sandboxer.cc``): both outputs split into tokens on any of space, ``\\n``,
  ``\\t``, ``\\r``, ``\\v`` (empty tokens skipped) and lower-cased (ASCII); equal token lists
  match; otherwise the counts must agree and each pair must match: two tokens that both parse
  as numbers (absl's ``SimpleAtod``: decimal, exponent, ``inf``, ``nan``; an integer parses too)
  match when ``|a - b| < 1e-5`` (an absolute tolerance), any other pair only when equal.
* ``livecodebench``: LiveCodeBench's ``grade_stdio`` (LiveCodeBench/LiveCodeBench,
  ``lcb_runner/evaluation/testing_util.py``): both outputs stripped, split on ``\\n``, each line
  stripped; the line counts must agree; a line matches when equal, or when both lines split
  into whitespace tokens that all parse as ``decimal.Decimal`` and the two lists of Decimals
  are equal (exact decimal equality: ``1.0`` matches ``1``, ``0.1`` never matches
  ``0.1000001``, and 50000000000000000 never matches 50000000000000001).

:data:`COMPARE_MODES` lists the canonical names; :data:`ALIASES` maps other spellings (the
Evaluator's old names ``exact``, ``whitespace`` and ``float`` are canonical names here).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from types import MappingProxyType

__all__ = ["ALIASES", "COMPARE_MODES", "compare_output", "normalize_mode", "outputs_match"]

COMPARE_MODES: tuple[str, ...] = (
    "exact",
    "whitespace",
    "float",
    "sandboxfusion",
    "codecontests",
    "livecodebench",
)
"""The canonical comparison modes."""

ALIASES = MappingProxyType(
    {
        "strict": "exact",
        "tokens": "whitespace",
        "token": "whitespace",
        "whitespace_insensitive": "whitespace",
        "ws": "whitespace",
        "sandbox_fusion": "sandboxfusion",
        "sandbox-fusion": "sandboxfusion",
        "sf": "sandboxfusion",
        "code_contests": "codecontests",
        "code-contests": "codecontests",
        "livecodebench_decimal": "livecodebench",
        "live_code_bench": "livecodebench",
        "lcb": "livecodebench",
        "decimal": "livecodebench",
    }
)
"""Other names of the modes."""


def normalize_mode(mode: str) -> str:
    """The canonical name of ``mode`` (a ``ValueError`` naming the modes when unknown)."""
    if not isinstance(mode, str):
        raise TypeError(f"comparison mode must be a str, got {type(mode).__name__}")
    m = mode.strip().lower()
    m = ALIASES.get(m, m)
    if m not in COMPARE_MODES:
        raise ValueError(
            f"unknown comparison mode {mode!r} (one of {', '.join(COMPARE_MODES)}; "
            f"aliases {', '.join(sorted(ALIASES))})"
        )
    return m


def _text(name: str, v: str | bytes) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    raise TypeError(f"compare_output: {name} must be str or bytes, got {type(v).__name__}")


# --- agentrl's own -------------------------------------------------------------------------


def _norm_exact(text: str) -> str:
    return text.replace("\r\n", "\n").rstrip("\n")


def _exact(got: str, want: str, tol: float) -> bool:
    return _norm_exact(got) == _norm_exact(want)


def _whitespace(got: str, want: str, tol: float) -> bool:
    return got.split() == want.split()


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


def _float(got: str, want: str, tol: float) -> bool:
    a, b = got.split(), want.split()
    return len(a) == len(b) and all(
        _float_token_match(x, y, tol) for x, y in zip(a, b, strict=True)
    )


# --- SandboxFusion ---------------------------------------------------------------------------


def _py_float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def _sandboxfusion(got: str, want: str, tol: float) -> bool:
    g = got.strip().split("\n")
    w = want.strip().split("\n")
    if len(g) - len(w) == 1 and g[-1] == "":
        g = g[:-1]
    if len(w) - len(g) == 1 and w[-1] == "":
        w = w[:-1]
    if len(g) != len(w):
        return False
    for rl, el in zip(g, w, strict=True):
        rl, el = rl.lower(), el.lower()
        if rl.strip() == el.strip():
            continue
        a, b = _py_float(rl), _py_float(el)
        if a is None or b is None:
            return False
        try:
            if not abs(a - b) / max(abs(b), 1e-10) < 1e-5:
                return False
        except (OverflowError, ValueError):  # pragma: no cover - floats do not raise here
            return False
    return True


# --- CodeContests ------------------------------------------------------------------------------

_CC_SPLIT = re.compile(r"[ \n\t\r\v]+")
_CC_NUMBER = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|inf(?:inity)?|nan)\Z", re.IGNORECASE
)


def _cc_tokens(text: str) -> list[str]:
    return [t.translate(_ASCII_LOWER) for t in _CC_SPLIT.split(text) if t]


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _cc_number(tok: str) -> float | None:
    if not _CC_NUMBER.match(tok) or tok.startswith("+-") or tok.startswith("-+"):
        return None
    try:
        return float(tok)
    except (ValueError, OverflowError):  # pragma: no cover - the regex admits only floats
        return None


def _codecontests(got: str, want: str, tol: float) -> bool:
    a, b = _cc_tokens(got), _cc_tokens(want)
    if a == b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        fx, fy = _cc_number(x), _cc_number(y)
        if fx is None or fy is None:
            if x != y:
                return False
        elif not abs(fx - fy) < 1e-5:
            return False
    return True


# --- LiveCodeBench -----------------------------------------------------------------------------


def _decimals(line: str) -> list[object] | None:
    from decimal import Decimal, InvalidOperation

    try:
        return [Decimal(t) for t in line.split()]
    except (InvalidOperation, ValueError):
        return None


def _livecodebench(got: str, want: str, tol: float) -> bool:
    from decimal import InvalidOperation

    g = [line.strip() for line in got.strip().split("\n")]
    w = [line.strip() for line in want.strip().split("\n")]
    if len(g) != len(w):
        return False
    for x, y in zip(g, w, strict=True):
        if x == y:
            continue
        dx, dy = _decimals(x), _decimals(y)
        if dx is None or dy is None:
            return False
        try:
            if dx != dy:
                return False
        except InvalidOperation:  # a signalling NaN refuses to compare: no match
            return False
    return True


_MODES: dict[str, Callable[[str, str, float], bool]] = {
    "exact": _exact,
    "whitespace": _whitespace,
    "float": _float,
    "sandboxfusion": _sandboxfusion,
    "codecontests": _codecontests,
    "livecodebench": _livecodebench,
}


def compare_output(
    got: str | bytes, want: str | bytes, mode: str = "exact", *, float_tol: float = 1e-6
) -> bool:
    """Whether stdout ``got`` matches the expected ``want`` under ``mode`` (see the module's
    description of each; bytes are decoded as UTF-8, bad bytes replaced). ``float_tol`` is the
    tolerance of ``"float"``; the other modes use their projects' fixed tolerances."""
    fn = _MODES[normalize_mode(mode)]
    if isinstance(float_tol, bool) or not isinstance(float_tol, (int, float)):
        raise TypeError("float_tol must be a number")
    return fn(_text("got", got), _text("want", want), float(float_tol))


def outputs_match(got: str, want: str, mode: str = "exact", float_tol: float = 1e-6) -> bool:
    """The Evaluator's old entry point: :func:`compare_output` on two str."""
    if not isinstance(got, str) or not isinstance(want, str):
        raise TypeError("outputs_match compares two str")
    return compare_output(got, want, mode, float_tol=float_tol)
