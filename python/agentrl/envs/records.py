"""Tasks from plain records: what environments and trainer adapters receive (dataset rows,
JSON strings, verl ground truths) turned into :mod:`agentrl.evaluation` tasks."""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    """A task from a record's fields (:func:`agentrl.evaluation.task_from_dict`'s layouts:
    HumanEval ``test`` + ``entry_point``, MBPP ``test_list``, stdin/stdout ``cases`` or
    ``inputs`` + ``outputs``), also accepting what data set rows and trainer columns carry:
    no ``prompt`` or a chat prompt (the completion then holds all the code), ``test_list``
    as JSON text, and APPS' ``input_output`` (JSON text or a mapping of ``inputs`` and
    ``outputs``, lists of lines allowed). ``prompt`` replaces the record's prompt."""
    from agentrl.evaluation import task_from_dict

    if not isinstance(d, Mapping):
        raise TypeError(f"task fields must be a mapping, got {type(d).__name__}")
    record = dict(d)
    if prompt is not None:
        record["prompt"] = prompt
    elif not isinstance(record.get("prompt", ""), str):
        record["prompt"] = ""
    if "test" in record and "entry_point" in record:
        record.setdefault("prompt", "")
    if isinstance(record.get("test_list"), str):
        record["test_list"] = json.loads(record["test_list"])
    if "input_output" in record and "cases" not in record and "inputs" not in record:
        io = record.pop("input_output")
        if isinstance(io, str):
            io = json.loads(io)
        if not isinstance(io, Mapping) or "inputs" not in io or "outputs" not in io:
            raise ValueError("input_output must hold 'inputs' and 'outputs'")
        record["inputs"] = [_joined(x) for x in io["inputs"]]
        record["outputs"] = [_joined(x) for x in io["outputs"]]
    return task_from_dict(record, where=str(record.get("task_id", "task")))


def _joined(v: Any) -> str:
    """APPS stores some inputs/outputs as lists of lines."""
    if isinstance(v, list):
        return "\n".join(str(x) for x in v) + "\n"
    return str(v)
