"""Reward shaping from a :class:`~agentrl.evaluation.Judgement`.

``shape(judgement, completion, config)`` turns a verdict into a :class:`Reward`: the fraction
of tests passed (or 1/0), plus a weight for the error class, a length penalty and a format
bonus. A masked judgement (an infrastructure failure) yields no reward at all
(``value=None``), never 0: the sample must be dropped, not punished.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agentrl.evaluation.judgement import ErrorClass, Judgement

__all__ = ["Reward", "RewardConfig", "extract_code", "has_expected_format", "shape"]

FORMATS = ("fence", "def", "fence_and_def")


def _default_error_weights() -> dict[str, float]:
    return {
        "syntax_error": -0.5,
        "compile_error": -0.5,
        "runtime_error": 0.0,
        "timeout": 0.0,
        "memory_limit": 0.0,
        "output_limit": 0.0,
        "wrong_answer": 0.0,
    }


@dataclass
class RewardConfig:
    """How a judgement becomes a scalar reward; every term is reported in ``components``."""

    partial_credit: bool = True
    """Correctness term = fraction of test cases passed; otherwise 1.0 if everything passed,
    else 0.0."""
    pass_reward: float = 1.0
    """Scale of the correctness term (the reward of a full pass, before the other terms)."""
    error_weights: Mapping[str, float] = field(default_factory=_default_error_weights)
    """Added when the completion failed, by its error class (``Judgement.error_class``:
    ``syntax_error``, ``compile_error``, ``runtime_error``, ``timeout``, ``memory_limit``,
    ``output_limit``, ``wrong_answer``); negative values are penalties. Missing classes add 0."""
    length_penalty: float = 0.0
    """Subtracted per unit of length beyond ``target_length`` (0 disables it)."""
    target_length: int | None = None
    """Length allowed without penalty; ``None`` disables the length penalty."""
    length_fn: Callable[[str], int] | None = None
    """Measures a completion's length, e.g. a tokenizer's token count; default: characters."""
    max_length_penalty: float | None = None
    """Cap on the length penalty's magnitude (``None``: uncapped)."""
    format_weight: float = 0.0
    """Added when the completion has the expected format (see ``format``)."""
    format: str = "fence"
    """The expected format: ``"fence"`` (exactly one fenced code block), ``"def"`` (the code
    parses and defines the entry point, or any function when it is unknown) or
    ``"fence_and_def"`` (both)."""

    def __post_init__(self) -> None:
        for name in ("pass_reward", "length_penalty", "format_weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"RewardConfig.{name} must be a finite number, got {v!r}")
        if self.length_penalty < 0:
            raise ValueError("RewardConfig.length_penalty must be non-negative (it is subtracted)")
        if self.target_length is not None and (
            isinstance(self.target_length, bool)
            or not isinstance(self.target_length, int)
            or self.target_length < 0
        ):
            raise ValueError("RewardConfig.target_length must be a non-negative int or None")
        if self.max_length_penalty is not None and not self.max_length_penalty >= 0:
            raise ValueError("RewardConfig.max_length_penalty must be non-negative or None")
        if self.format not in FORMATS:
            raise ValueError(f"RewardConfig.format must be one of {FORMATS}, got {self.format!r}")
        if not isinstance(self.error_weights, Mapping):
            raise TypeError("RewardConfig.error_weights must be a mapping of class to weight")
        weights = {}
        for k, v in self.error_weights.items():
            key = k.value if isinstance(k, ErrorClass) else k
            if key not in {c.value for c in ErrorClass} or key in ("passed", "sandbox_error"):
                raise ValueError(f"RewardConfig.error_weights: unknown error class {k!r}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"RewardConfig.error_weights[{key!r}] must be a finite number")
            weights[key] = float(v)
        self.error_weights = weights
        if self.length_fn is not None and not callable(self.length_fn):
            raise TypeError("RewardConfig.length_fn must be callable")


@dataclass(frozen=True)
class Reward:
    """A shaped reward. ``value`` is ``None`` when ``masked``: drop the sample."""

    value: float | None
    """The reward (sum of ``components``), or ``None`` when masked."""
    masked: bool
    """The judgement was an infrastructure failure: no reward."""
    reason: str | None
    """Why it is masked."""
    components: dict[str, float]
    """The terms: ``correctness``, ``error``, ``length``, ``format``."""


_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.#-]*)[^\n]*\n", re.MULTILINE)


def _blocks(text: str) -> list[tuple[str, str, bool]]:
    """Fenced blocks as (language, body, closed)."""
    out = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if not m:
            return out
        fence, lang = m.group(1), m.group(2).lower()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end = close.search(text, m.end())
        if end is None:
            out.append((lang, text[m.end() :], False))
            return out
        out.append((lang, text[m.end() : end.start()], True))
        pos = end.end()


def extract_code(completion: str) -> str:
    """The code of a completion: the first Python fenced block (```` ```python ````,
    ```` ```py ```` or untagged; an unclosed final fence runs to the end), else the text as is."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    blocks = _blocks(completion)
    for lang, body, _ in blocks:
        if lang in ("python", "py", "python3"):
            return body
    for lang, body, _ in blocks:
        if lang == "":
            return body
    return completion


def _defines(code: str, entry_point: str | None) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            entry_point is None or node.name == entry_point
        ):
            return True
    return False


def has_expected_format(completion: str, fmt: str, entry_point: str | None = None) -> bool:
    """Whether ``completion`` has format ``fmt`` (see :attr:`RewardConfig.format`)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    blocks = _blocks(completion)
    fenced = len(blocks) == 1 and blocks[0][2]
    if fmt == "fence":
        return fenced
    defined = _defines(extract_code(completion), entry_point)
    return defined if fmt == "def" else fenced and defined


def shape(judgement: Judgement, completion: str, config: RewardConfig | None = None) -> Reward:
    """The reward of ``completion`` given its ``judgement``:
    ``correctness + error weight + format bonus - length penalty``, or a masked reward
    (``value=None``) when the judgement is masked."""
    if not isinstance(judgement, Judgement):
        raise TypeError(f"judgement must be a Judgement, got {type(judgement).__name__}")
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    cfg = config if config is not None else RewardConfig()
    if not isinstance(cfg, RewardConfig):
        raise TypeError(f"config must be a RewardConfig, got {type(cfg).__name__}")
    if judgement.masked:
        return Reward(None, True, judgement.mask_reason or "masked", {})
    if cfg.partial_credit:
        correctness = cfg.pass_reward * (1.0 if judgement.passed else judgement.fraction)
    else:
        correctness = cfg.pass_reward if judgement.passed else 0.0
    error = 0.0
    if not judgement.passed:
        error = cfg.error_weights.get(judgement.error_class.value, 0.0)
    length = 0.0
    if cfg.target_length is not None and cfg.length_penalty:
        n = cfg.length_fn(completion) if cfg.length_fn is not None else len(completion)
        length = cfg.length_penalty * max(0, n - cfg.target_length)
        if cfg.max_length_penalty is not None:
            length = min(length, cfg.max_length_penalty)
    fmt = 0.0
    if cfg.format_weight and has_expected_format(completion, cfg.format, judgement.entry_point):
        fmt = cfg.format_weight
    components = {"correctness": correctness, "error": error, "length": -length, "format": fmt}
    return Reward(correctness + error - length + fmt, False, None, components)
