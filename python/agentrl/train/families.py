"""The built-in family of verifiable coding tasks of ``agentrl train``.

Each task asks for a one-line Python function from a short spec and one example::

    # multiply x by 3, then add 4
    # f(2) == 10
    def f(x): return

and the model completes the line (``x * 3 + 4``). Hidden tests (several inputs, one assert
each, so that partial credit is possible) run in the sandbox through
:mod:`agentrl.evaluation`. Families: integer arithmetic, affine maps, comparisons, string
slicing and repetition, list reductions; each is parameterised by an operation and small
constants. The train / held-out split is by parameters: a held-out task's combination of
operation and constants never appears in the warm start data or in RL.

The warm start imitates a *weak* programmer (:func:`weak_completion`): with probability
``p_correct`` the correct body, otherwise a plausible wrong one (wrong operator, constant
off by one, operands swapped, wrong slice). A model fitted to that data solves only a
fraction of the tasks when sampling, and the partial-credit rewards of the sandbox tell
RL which variants are right.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FAMILIES", "CodeTask", "all_tasks", "split_tasks", "task_stream", "warm_start_data"]


@dataclass(frozen=True)
class CodeTask:
    """One built-in task: write the body of ``def f(arg): return ...``."""

    task_id: str
    """Unique name, e.g. ``"affine/plus/3/4"``."""
    family: str
    """The family (``"arith"``, ``"affine"``, ``"compare"``, ``"string"``, ``"list"``)."""
    spec: str
    """The English spec shown in the prompt."""
    arg: str
    """The argument's name (``x``, ``s``, ``xs``)."""
    solution: str
    """A correct body expression."""
    tests: tuple[tuple[Any, Any], ...]
    """``(input, expected output)`` pairs of the hidden tests."""
    wrong: tuple[str, ...]
    """Plausible wrong bodies (the weak programmer's mistakes)."""

    @property
    def prompt(self) -> str:
        """The text the model completes: the spec, then ``def f(arg): return ``."""
        return f"# {self.spec}\ndef f({self.arg}): return "

    @property
    def test_source(self) -> str:
        """human-eval style ``check(candidate)`` with one assert per hidden test."""
        lines = ["def check(candidate):"]
        lines += [f"    assert candidate({x!r}) == {y!r}" for x, y in self.tests]
        return "\n".join(lines) + "\n"

    def to_function_task(self) -> Any:
        """The :class:`agentrl.evaluation.FunctionTask` the sandbox evaluator judges."""
        from agentrl.evaluation import FunctionTask

        return FunctionTask(
            task_id=self.task_id,
            prompt=self.prompt,
            test=self.test_source,
            entry_point="f",
            canonical_solution=self.solution,
        )

    def check_locally(self, body: str) -> float:
        """Fraction of hidden tests ``body`` passes, run in THIS process (trusted bodies
        only: used to validate the generated tasks, never for model output)."""
        fn = eval(f"lambda {self.arg}: {body}")
        ok = 0
        for x, y in self.tests:
            with contextlib.suppress(Exception):
                ok += fn(x) == y
        return ok / len(self.tests)


# ---- the families

_INTS = (0, 1, 2, 5, 7, 10, -3)


def _spec_fn(body: str, arg: str) -> Callable[[Any], Any]:
    return eval(f"lambda {arg}: {body}")


def _int_inputs(k: int) -> tuple[int, ...]:
    # Around the constant too, so that boundary mistakes (> vs >=) show.
    return tuple(dict.fromkeys((3, *_INTS, k - 1, k, k + 1)))


def _make(
    family: str,
    name: str,
    spec: str,
    arg: str,
    body: str,
    wrong: Sequence[str],
    inputs: Sequence[Any],
) -> CodeTask:
    fn = _spec_fn(body, arg)
    task = CodeTask(
        f"{family}/{name}", family, spec, arg, body, tuple((x, fn(x)) for x in inputs), ()
    )
    # Keep only real mistakes: bodies that fail at least one hidden test.
    kept = [w for w in dict.fromkeys(wrong) if w != body and task.check_locally(w) < 1.0]
    return dataclasses.replace(task, wrong=tuple(kept))


def _templated(
    family: str,
    arg: str,
    ops: dict[str, tuple[str, str, Sequence[str]]],
    ks: Iterable[int],
    fields: Callable[[str, int], dict[str, int]],
    inputs: Callable[[int], Sequence[Any]],
) -> Iterator[CodeTask]:
    """One task per template of ``ops`` (``name: (spec, body, wrong bodies)``) and constant
    ``k`` of ``ks``: the templates filled with ``fields(name, k)``, tested on ``inputs(k)``."""
    for op, (spec, body, wrong) in ops.items():
        for k in ks:
            f = fields(op, k)
            yield _make(
                family,
                f"{op}/{k}",
                spec.format(**f),
                arg,
                body.format(**f),
                [w.format(**f) for w in wrong],
                inputs(k),
            )


def _arith() -> Iterator[CodeTask]:
    ops = {
        "add": ("add {k} to x", "x + {k}", ["x - {k}", "x * {k}", "x + {k1}", "x + {km}"]),
        "sub": ("subtract {k} from x", "x - {k}", ["{k} - x", "x + {k}", "x - {k1}", "x - {km}"]),
        "mul": ("multiply x by {k}", "x * {k}", ["x + {k}", "x ** {k}", "x * {k1}", "x * {km}"]),
        "div": (
            "divide x by {k}, rounding down",
            "x // {k}",
            ["x % {k}", "x / {k}", "x // {k1}", "{k} // x"],
        ),
        "mod": (
            "the remainder of x divided by {k}",
            "x % {k}",
            ["x // {k}", "{k} % x", "x % {k1}", "x % {km}"],
        ),
    }

    def fields(op: str, k: int) -> dict[str, int]:
        return {"k": k, "k1": k + 1, "km": max(k - 1, 1) if op in ("div", "mod") else k - 1}

    yield from _templated("arith", "x", ops, range(1, 10), fields, _int_inputs)


def _affine() -> Iterator[CodeTask]:
    for sign, word in (("+", "add"), ("-", "subtract")):
        other = "-" if sign == "+" else "+"
        for a in range(2, 10):
            for b in range(1, 10):
                spec = f"multiply x by {a}, then {word} {b}"
                body = f"x * {a} {sign} {b}"
                wrong = [
                    f"x * {a} {other} {b}",
                    f"x + {a} {sign} {b}",
                    f"x * {a + 1} {sign} {b}",
                    f"x * {a} {sign} {b + 1}",
                    f"x * {b} {sign} {a}",
                    f"x * ({a} {sign} {b})",
                ]
                name = "plus" if sign == "+" else "minus"
                yield _make("affine", f"{name}/{a}/{b}", spec, "x", body, wrong, _INTS)


def _compare() -> Iterator[CodeTask]:
    ops = {
        "gt": ("x is greater than {k}", "x > {k}", ["x >= {k}", "x < {k}", "x > {k1}"]),
        "lt": ("x is less than {k}", "x < {k}", ["x <= {k}", "x > {k}", "x < {k1}"]),
        "ge": ("x is at least {k}", "x >= {k}", ["x > {k}", "x <= {k}", "x >= {k1}"]),
        "le": ("x is at most {k}", "x <= {k}", ["x < {k}", "x >= {k}", "x <= {k1}"]),
        "eq": ("x equals {k}", "x == {k}", ["x >= {k}", "x != {k}", "x == {k1}"]),
    }
    yield from _templated(
        "compare", "x", ops, range(10), lambda _, k: {"k": k, "k1": k + 1}, _int_inputs
    )


_WORDS = ("agentrl", "sandbox", "policy", "ab", "", "reward!", "x")


def _string() -> Iterator[CodeTask]:
    ops = {
        "head": ("the first {k} characters of s", "s[:{k}]", ["s[{k}:]", "s[:{k1}]", "s[-{k}:]"]),
        "tail": ("the last {k} characters of s", "s[-{k}:]", ["s[{k}:]", "s[:{k}]", "s[-{k1}:]"]),
        "drop": (
            "s without its first {k} characters",
            "s[{k}:]",
            ["s[:{k}]", "s[{k1}:]", "s[-{k}:]"],
        ),
        "rep": ("s repeated {k} times", "s * {k}", ["s * {k1}", "s + s", "s * {km}"]),
    }
    yield from _templated(
        "string",
        "s",
        ops,
        range(1, 10),
        lambda _, k: {"k": k, "k1": k + 1, "km": k - 1},
        lambda _: _WORDS,
    )


_LISTS = ([3, 1, 4], [1, 5, 9, 2, 6], [7], [2, 7, 1, 8, 2, 8], [-1, -5, 0])


def _list() -> Iterator[CodeTask]:
    ops = {
        "sum": ("the sum of xs, plus {k}", "sum(xs) + {k}", ["max(xs) + {k}", "sum(xs) * {k}", "sum(xs) + {k1}", "len(xs) + {k}"]),
        "max": ("the largest item of xs, times {k}", "max(xs) * {k}", ["min(xs) * {k}", "max(xs) + {k}", "sum(xs) * {k}", "max(xs) * {k1}"]),
        "len": ("the length of xs, plus {k}", "len(xs) + {k}", ["len(xs) - {k}", "sum(xs) + {k}", "len(xs) + {k1}", "len(xs) * {k}"]),
    }  # fmt: skip
    yield from _templated(
        "list",
        "xs",
        ops,
        range(1, 10),
        lambda _, k: {"k": k, "k1": k + 1},
        lambda _: tuple(list(v) for v in _LISTS),
    )


FAMILIES = ("arith", "affine", "compare", "string", "list")


def all_tasks(families: Sequence[str] | None = None) -> list[CodeTask]:
    """Every task of the built-in family (a few hundred), in a fixed order; ``families``
    restricts it to those families."""
    makers = {"arith": _arith, "affine": _affine, "compare": _compare, "string": _string}
    makers["list"] = _list
    names = FAMILIES if families is None else tuple(families)
    for f in names:
        if f not in makers:
            raise ValueError(f"unknown task family {f!r}; the families are {FAMILIES}")
    return [t for f in names for t in makers[f]()]


def split_tasks(
    tasks: Sequence[CodeTask] | None = None, held_out: float = 0.25, seed: int = 0
) -> tuple[list[CodeTask], list[CodeTask]]:
    """``(train, held_out)``: a fixed share of each family, chosen by a seeded hash of the
    task id, is held out (its parameter combinations are never trained on)."""
    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out must be in (0, 1), got {held_out!r}")
    tasks = all_tasks() if tasks is None else list(tasks)
    train: list[CodeTask] = []
    test: list[CodeTask] = []
    families: dict[str, list[CodeTask]] = {}
    for t in tasks:
        families.setdefault(t.family, []).append(t)
    for members in families.values():
        ranked = sorted(members, key=lambda t: zlib.crc32(f"{seed}:{t.task_id}".encode()))
        n = max(1, round(held_out * len(ranked)))
        held = {t.task_id for t in ranked[:n]}
        for t in members:
            (test if t.task_id in held else train).append(t)
    return train, test


def weak_completion(task: CodeTask, rng: random.Random, p_correct: float) -> str:
    """A completion of the weak programmer the warm start imitates: the correct body with
    probability ``p_correct``, else one of the task's plausible mistakes."""
    if not task.wrong or rng.random() < p_correct:
        return task.solution
    return rng.choice(task.wrong)


def warm_start_data(
    tasks: Sequence[CodeTask], n: int, *, p_correct: float, seed: int = 0
) -> list[tuple[str, str]]:
    """``n`` ``(prompt, completion)`` pairs of the weak programmer on ``tasks``; each
    completion ends with a newline (the stop string of generation)."""
    if not tasks:
        raise ValueError("warm_start_data needs at least one task")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.choice(tasks)
        out.append((t.prompt, weak_completion(t, rng, p_correct) + "\n"))
    return out


def task_stream(tasks: Sequence[CodeTask], seed: int = 0) -> Iterator[CodeTask]:
    """An endless stream of ``tasks``: seeded shuffles, one epoch after another."""
    if not tasks:
        raise ValueError("task_stream needs at least one task")
    rng = random.Random(seed)
    order = list(tasks)
    while True:
        rng.shuffle(order)
        yield from order
