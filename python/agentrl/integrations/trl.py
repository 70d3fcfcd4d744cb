"""TRL adapter: verifiable code rewards for ``trl.GRPOTrainer(reward_funcs=[...])``.

TRL calls each reward function as ``f(prompts=..., completions=..., completion_ids=...,
**columns)`` where ``columns`` are the data set's other columns (one value per completion)
plus ``trainer_state``, ``log_extra`` and ``log_metric``. It turns None into NaN and leaves
rows that no function scored out of the advantage baseline (so a masked reward really is
no reward), and it gathers the reward functions whose ``__call__`` is a coroutine on its
own event loop. Use::

    from agentrl.integrations.trl import CodeReward, AsyncCodeReward
    trainer = GRPOTrainer(model, reward_funcs=[AsyncCodeReward()], train_dataset=ds, ...)

with a data set whose rows carry the task: HumanEval/MBPP/stdin-stdout fields
(``test`` + ``entry_point``, ``test_list``, ``input_output``...), a ``task`` column (a
record or JSON text), or a ``task_id`` found in ``tasks=``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentrl.envs.records import coerce_task
from agentrl.integrations._common import Scored, Scorer, task_table

if TYPE_CHECKING:
    from agentrl.evaluation import Evaluator, Task
    from agentrl.evaluation.rewards import RewardConfig

__all__ = ["AsyncCodeReward", "CodeReward"]

_TRL_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric", "environments"})
_PROMPT_SOURCES = ("auto", "prompt", "task", "none")


def _is_code(text: str) -> bool:
    """Whether a prompt is Python code a completion continues: it parses and holds more than
    bare expressions (a one-word instruction parses too)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return any(not isinstance(node, ast.Expr) for node in tree.body)


class CodeReward:
    """A TRL reward function that judges code completions in the sandbox.

    * ``evaluator``: an :class:`agentrl.evaluation.Evaluator` to borrow; None makes one on
      first use (``workers``, ``timeout``) that :meth:`close` closes.
    * ``tasks``: a table of tasks (mapping or iterable) that a ``task_id`` column selects.
    * ``reward``: the :class:`agentrl.evaluation.rewards.RewardConfig` of the shaping.
    * ``extract_code``: judge the markdown fence's code when the completion has one.
    * ``prompt_source``: the code a completion continues (HumanEval completions continue
      the prompt's signature): ``"auto"`` takes a ``task_prompt`` column, else the task
      table's prompt, else the TRL prompt when it is Python code (more than bare
      expressions), else nothing; ``"prompt"`` always the TRL prompt (a str); ``"task"``
      the task's own; ``"none"`` nothing (the completion holds the whole program).
    * ``log``: report ``pass_rate``/``pass_fraction``/``masked`` through TRL's
      ``log_metric`` and the error class through ``log_extra``.
    * ``name``: the ``__name__`` TRL logs the reward under.

    Returns one float per completion, None where the reward is masked (an infrastructure
    failure).
    """

    def __init__(
        self,
        evaluator: Evaluator | None = None,
        *,
        tasks: Mapping[str, Any] | Iterable[Any] | None = None,
        reward: RewardConfig | None = None,
        extract_code: bool = True,
        prompt_source: str = "auto",
        log: bool = True,
        name: str = "agentrl_code",
        workers: int | None = None,
        timeout: float = 3.0,
    ) -> None:
        if prompt_source not in _PROMPT_SOURCES:
            raise ValueError(f"prompt_source must be one of {_PROMPT_SOURCES}: {prompt_source!r}")
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty str")
        self.scorer = Scorer(
            evaluator, reward=reward, extract_code=extract_code, workers=workers, timeout=timeout
        )
        self.tasks = task_table(tasks)
        self.prompt_source = prompt_source
        self.log = log
        self.__name__ = name
        self.last: list[Scored] = []
        """The verdicts of the latest call (for inspection)."""

    # ---- the call
    def __call__(
        self,
        prompts: list[Any] | None = None,
        completions: list[Any] | None = None,
        completion_ids: list[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        tasks, completions = self._tasks(prompts, completions, kwargs)
        return self._finish(self.scorer.score(tasks, completions), kwargs)

    def _tasks(
        self, prompts: list[Any] | None, completions: list[Any] | None, kwargs: dict[str, Any]
    ) -> tuple[list[Task], list[Any]]:
        if completions is None:
            raise TypeError("completions is required")
        completions = list(completions)
        n = len(completions)
        if prompts is not None and len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        columns = {}
        for k, v in kwargs.items():
            if k in _TRL_KWARGS:
                continue
            if not isinstance(v, (list, tuple)) or len(v) != n:
                raise ValueError(f"column {k!r} must hold one value per completion ({n})")
            columns[k] = v
        rows = [{k: v[i] for k, v in columns.items()} for i in range(n)]
        prompt_list = list(prompts) if prompts is not None else [None] * n
        return [self._task(r, p) for r, p in zip(rows, prompt_list, strict=True)], completions

    def _task(self, row: dict[str, Any], prompt: Any) -> Task:
        src = self.prompt_source
        code: str | None
        if src == "none":
            code = ""
        elif src == "prompt":
            if not isinstance(prompt, str):
                raise TypeError('prompt_source="prompt" needs str prompts')
            code = prompt
        elif src == "task":
            code = None
        elif isinstance(row.get("task_prompt"), str):
            code = row["task_prompt"]
        else:
            code = None
        if "task" in row:
            return coerce_task(row["task"], prompt=code)
        tid = row.get("task_id")
        if tid is not None and str(tid) in self.tasks:
            return coerce_task(self.tasks[str(tid)], prompt=code)
        if code is None and src == "auto":
            code = prompt if isinstance(prompt, str) and _is_code(prompt) else ""
        return coerce_task(row, prompt=code if code is not None else None)

    def _finish(self, scored: list[Scored], kwargs: dict[str, Any]) -> list[float | None]:
        self.last = scored
        if self.log:
            live = [s for s in scored if s.value is not None]
            log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
            if callable(log_metric):
                name = self.__name__
                if live:
                    log_metric(
                        f"{name}/pass_rate", sum(s.judgement.passed for s in live) / len(live)
                    )
                    frac = sum(s.judgement.fraction for s in live) / len(live)
                    log_metric(f"{name}/pass_fraction", frac)
                log_metric(f"{name}/masked", (len(scored) - len(live)) / max(1, len(scored)))
            if callable(log_extra):
                log_extra(
                    f"{self.__name__}_error",
                    [str(getattr(s.judgement.error_class, "value", "")) for s in scored],
                )
        return [s.value for s in scored]

    def close(self) -> None:
        """Closes the evaluator if this object made it."""
        self.scorer.close()

    def __enter__(self) -> CodeReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<agentrl {type(self).__name__} {self.__name__!r} tasks={len(self.tasks)}>"


class AsyncCodeReward(CodeReward):
    """:class:`CodeReward` with a coroutine ``__call__``: TRL runs it on its event loop,
    concurrently with its other async reward functions, and the judgements run on the
    evaluator's pool without a blocked thread."""

    async def __call__(  # type: ignore[override]
        self,
        prompts: list[Any] | None = None,
        completions: list[Any] | None = None,
        completion_ids: list[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        tasks, completions = self._tasks(prompts, completions, kwargs)
        return self._finish(await self.scorer.ascore(tasks, completions), kwargs)
