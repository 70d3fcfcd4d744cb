"""Tasks from plain records: what environments and trainer adapters receive (dataset rows,
JSON strings, verl ground truths) turned into :mod:`agentrl.evaluation` tasks."""

from __future__ import annotations

import ast
import json
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.evaluation import Task

__all__ = ["coerce_task", "task_from_fields"]


def coerce_task(obj: Any, *, prompt: str | None = None) -> Task:
    """A :class:`~agentrl.evaluation.FunctionTask` or :class:`~agentrl.evaluation.IOTask`
    from a task, a mapping of fields (see :func:`task_from_fields`) or its JSON text.
    ``prompt`` replaces the record's prompt (the code the completion continues)."""
    from agentrl.evaluation import FunctionTask, IOTask

    if isinstance(obj, (FunctionTask, IOTask)):
        if prompt is not None and prompt != obj.prompt:
            import dataclasses

            return dataclasses.replace(obj, prompt=prompt)
        return obj
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except ValueError as e:
            raise ValueError(f"a task given as text must be JSON: {e}") from None
    if isinstance(obj, Mapping):
        return task_from_fields(obj, prompt=prompt)
    raise TypeError(f"cannot make a task of {type(obj).__name__}")


def task_from_fields(d: Mapping[str, Any], *, prompt: str | None = None) -> Task:
    """A task from a record's fields, in the common data set layouts:

    * HumanEval: ``test`` and ``entry_point`` (``prompt``, ``task_id``,
      ``canonical_solution`` optional);
    * MBPP: ``test_list`` (asserts calling the function by name; ``test_setup_code``
      optional; the entry point is ``entry_point`` or the name the first assert calls);
    * stdin/stdout: ``cases`` (a list of ``{"input", "output"}`` or pairs), ``inputs`` and
      ``outputs``, or APPS' ``input_output`` (JSON text or a mapping of both lists);
      ``compare`` and ``float_tol`` optional.
    """
    from agentrl.evaluation import FunctionTask, IOCase, IOTask

    if not isinstance(d, Mapping):
        raise TypeError(f"task fields must be a mapping, got {type(d).__name__}")
    task_id = str(d.get("task_id", d.get("id", "")))
    text = prompt if prompt is not None else d.get("prompt", d.get("text", ""))
    if not isinstance(text, str):
        text = ""  # a chat prompt: the completion carries all the code
    if "test" in d and "entry_point" in d:
        return FunctionTask(
            task_id=task_id,
            prompt=text,
            test=_str(d, "test"),
            entry_point=_str(d, "entry_point"),
            canonical_solution=d.get("canonical_solution"),
        )
    if "test_list" in d:
        asserts = d["test_list"]
        if isinstance(asserts, str):
            asserts = json.loads(asserts)
        if not isinstance(asserts, Sequence) or not asserts:
            raise ValueError("test_list must be a non-empty list of assert statements")
        entry = d.get("entry_point") or _called_name(str(asserts[0]))
        setup = str(d.get("test_setup_code") or "")
        body = textwrap.indent("\n".join(str(a) for a in asserts), "    ")
        test = f"{setup}\n\ndef check(candidate):\n{body}\n"
        return FunctionTask(task_id=task_id, prompt=text, test=test, entry_point=entry)
    cases = _io_cases(d)
    if cases is not None:
        kw: dict[str, Any] = {}
        if "compare" in d:
            kw["compare"] = d["compare"]
        if "float_tol" in d:
            kw["float_tol"] = float(d["float_tol"])
        io = tuple(IOCase(str(i), str(o)) for i, o in cases)
        return IOTask(task_id=task_id, prompt=text, cases=io, **kw)
    raise ValueError(
        "no task in the record: give test+entry_point, test_list, cases, inputs+outputs or "
        f"input_output (got fields {sorted(d)})"
    )


def _str(d: Mapping[str, Any], key: str) -> str:
    v = d[key]
    if not isinstance(v, str):
        raise TypeError(f"{key} must be a str, got {type(v).__name__}")
    return v


def _called_name(assertion: str) -> str:
    """The name of the first function an assert statement calls."""
    try:
        tree = ast.parse(assertion.strip())
    except SyntaxError as e:
        raise ValueError(f"test_list entry is not Python: {assertion!r}") from e
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return node.func.id
    raise ValueError(f"cannot find the function that {assertion!r} calls: give entry_point")


def _io_cases(d: Mapping[str, Any]) -> list[tuple[Any, Any]] | None:
    if "cases" in d:
        out = []
        for c in d["cases"]:
            if isinstance(c, Mapping):
                out.append((c["input"], c["output"]))
            else:
                i, o = c
                out.append((i, o))
        return out
    src: Any = None
    if "inputs" in d and "outputs" in d:
        src = d
    elif "input_output" in d:
        src = d["input_output"]
        if isinstance(src, str):
            src = json.loads(src)
    if src is None:
        return None
    ins, outs = src["inputs"], src["outputs"]
    if len(ins) != len(outs):
        raise ValueError(f"{len(ins)} inputs but {len(outs)} outputs")
    return [(_joined(i), _joined(o)) for i, o in zip(ins, outs, strict=True)]


def _joined(v: Any) -> str:
    """APPS stores some inputs/outputs as lists of lines."""
    if isinstance(v, list):
        return "\n".join(str(x) for x in v) + "\n"
    return str(v)
