"""Typed config dataclasses: the kinds of their fields (from the annotations), type checks,
bounds, construction from nested dicts, field docstrings and TOML values. Used by
:mod:`agentrl.train.config`."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import math
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Any, NamedTuple

__all__ = ["Kind", "check", "check_types", "field_docs", "from_dict", "kinds", "toml_value"]


class Kind(NamedTuple):
    """What a field's annotation allows."""

    base: type
    """int, float, str, bool, or a part's dataclass."""
    optional: bool
    """None is allowed (and must be the default: a TOML file leaves None keys out)."""
    length: int | None
    """A tuple of this many ``base`` values; None: one."""


@functools.cache
def kinds(cls: type) -> dict[str, Kind]:
    """The :class:`Kind` of each field of dataclass ``cls``, from its annotations: ``int``,
    ``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, X, ...]`` (a fixed length) or a
    nested config dataclass."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Kind] = {}
    for f in fields(cls):
        tp, optional, length = hints[f.name], False, None
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = len(rest) < len(typing.get_args(tp))
            (tp,) = rest
        if typing.get_origin(tp) is tuple:
            elems = typing.get_args(tp)
            assert len(set(elems)) == 1 and Ellipsis not in elems, f"{cls.__name__}.{f.name}"
            tp, length = elems[0], len(elems)
        assert tp in (int, float, str, bool) or dataclasses.is_dataclass(tp), (cls, f.name)
        assert not optional or f.default is None, (
            f"{cls.__name__}.{f.name}: None must be its default"
        )
        out[f.name] = Kind(tp, optional, length)
    return out


def _scalar(base: type, v: Any, where: str) -> Any:
    if base is bool:
        if not isinstance(v, bool):
            raise TypeError(f"{where} must be a bool, got {v!r}")
    elif base is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{where} must be an int, got {v!r}")
    elif base is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{where} must be a number, got {v!r}")
        return float(v)
    elif base is str:
        if not isinstance(v, str):
            raise TypeError(f"{where} must be a str, got {v!r}")
    elif not isinstance(v, base):
        raise TypeError(f"{where} must be a {base.__name__}, got {v!r}")
    return v


def check_types(obj: Any) -> None:
    """Checks the type of each field, and normalises: int -> float, a list -> a tuple."""
    cls: Any = type(obj)
    for name, k in kinds(cls).items():
        v, where = getattr(obj, name), f"{type(obj).__name__}.{name}"
        if v is None and k.optional:
            continue
        if k.length is None:
            setattr(obj, name, _scalar(k.base, v, where))
        elif isinstance(v, (list, tuple)) and len(v) == k.length:
            setattr(obj, name, tuple(_scalar(k.base, x, where) for x in v))
        else:
            raise TypeError(f"{where} must be {k.length} values, got {v!r}")


def check(obj: Any, test: Callable[[Any], bool], what: str, *names: str) -> None:
    """Raises ValueError naming the first of ``names`` whose value (unless None) fails
    ``test``: ``Class.name must be {what}, got value``."""
    for name in names:
        v = getattr(obj, name)
        if v is not None and not test(v):
            raise ValueError(f"{type(obj).__name__}.{name} must be {what}, got {v!r}")


def from_dict(cls: type, d: Any) -> Any:
    """An instance of dataclass ``cls`` from a dict of its fields, a nested dataclass field
    from a nested dict; an unknown key is an error naming it."""
    if not isinstance(d, dict):
        raise TypeError(f"{cls.__name__} needs a table/dict of fields, got {d!r}")
    ks = kinds(cls)
    unknown = sorted(set(d) - set(ks))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    kw = {
        k: from_dict(ks[k].base, v)
        if dataclasses.is_dataclass(ks[k].base) and isinstance(v, dict)
        else v
        for k, v in d.items()
    }
    return cls(**kw)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal after it in the class body)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for a, b in itertools.pairwise(node.body):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f"}
_ESCAPES["\r"] = "\\r"


def toml_value(v: Any) -> str:
    """``v`` (bool, int, float, str, or a list/tuple of them) as a TOML value: floats by
    ``repr`` (which round-trips; ``inf``, ``-inf``, ``nan`` as TOML spells them), strings as
    basic strings with the escapes TOML requires (control characters and DEL)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, str):
        out = []
        for ch in v:
            if 0xD800 <= ord(ch) <= 0xDFFF:
                raise ValueError(f"cannot write {v!r} as TOML (a lone surrogate)")
            if ch in _ESCAPES:
                out.append(_ESCAPES[ch])
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04X}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write a {type(v).__name__} as TOML: {v!r}")
