"""verl adapter: ``compute_score`` for verl's reward managers.

Point verl's custom reward function at this file::

    reward.custom_reward_function.path=<site-packages>/agentrl/integrations/verl.py
    reward.custom_reward_function.name=compute_score        # or compute_score_async
    # batch manager (reward_manager.name=batch): name=compute_score_batch

verl calls ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`` once per response (the ``naive`` manager, in order; the reward loop's
managers await a coroutine function, or run a plain one in a thread), merged with the
config's ``reward_kwargs``; the ``batch`` manager calls ``compute_score_batch(
data_sources=..., solution_strs=..., ground_truths=..., extra_infos=...)``.
``ground_truth`` carries the task: a mapping or JSON text of its fields (HumanEval
``test`` + ``entry_point``, MBPP ``test_list``, stdin/stdout ``input_output`` or ``cases``;
see :func:`agentrl.envs.task_from_fields`); its ``prompt`` (or ``extra_info["task_prompt"]``)
is the code the response continues, if any.

Each call returns ``{"score", "acc", "pass_fraction", "masked", "error_class",
"mask_reason"}`` (the same keys every time, as verl's managers need to collect them).
verl has no "no reward": its managers write the score into a float tensor and its
advantage estimators do not skip NaN. A masked verdict (infrastructure failure) therefore
scores ``masked_score`` (default 0.0) with ``masked=1.0`` so it can be found in the logs;
``masked_score="raise"`` raises :class:`agentrl.envs.RewardMasked` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.envs.base import RewardMasked, StepResult
from agentrl.envs.records import coerce_task
from agentrl.integrations._common import Scored, Scorer, set_shared_scorer, shared_scorer

if TYPE_CHECKING:
    from agentrl.evaluation import Evaluator, Task
    from agentrl.evaluation.rewards import RewardConfig

__all__ = [
    "compute_score",
    "compute_score_async",
    "compute_score_batch",
    "configure",
]

_KEY = "verl"
_IGNORED = frozenset({"reward_router_address", "reward_model_tokenizer"})
"""Keywords verl's reward loop adds for model-based rewards; unused here."""


def configure(
    evaluator: Evaluator | None = None,
    *,
    reward: RewardConfig | None = None,
    extract_code: bool = True,
    workers: int | None = None,
    timeout: float = 3.0,
) -> None:
    """Sets the evaluator and shaping the module's functions use (default: an evaluator
    made on first use with the default settings). Closes an evaluator it made before. The
    setting is process-wide: it also reaches the copy of this module that verl loads by
    file path."""
    new = Scorer(
        evaluator, reward=reward, extract_code=extract_code, workers=workers, timeout=timeout
    )
    set_shared_scorer(_KEY, new)


def _get_scorer() -> Scorer:
    return shared_scorer(_KEY)


def _options(kwargs: Mapping[str, Any]) -> Any:
    unknown = set(kwargs) - _IGNORED - {"masked_score"}
    if unknown:
        raise TypeError(f"unexpected reward_kwargs: {', '.join(sorted(unknown))}")
    masked = kwargs.get("masked_score", 0.0)
    if masked != "raise" and (isinstance(masked, bool) or not isinstance(masked, (int, float))):
        raise TypeError(f'masked_score must be a number or "raise", got {masked!r}')
    return masked


def _task(ground_truth: Any, extra_info: Any) -> Task:
    prompt = None
    if isinstance(extra_info, Mapping) and isinstance(extra_info.get("task_prompt"), str):
        prompt = extra_info["task_prompt"]
    return coerce_task(ground_truth, prompt=prompt)


def _result(s: Scored, masked_score: Any) -> dict[str, Any]:
    j, r = s.judgement, s.reward
    if r.value is None:
        reason = r.reason or "masked"
        if masked_score == "raise":
            info = {"judgement": j, "reward": r, "masked": reason}
            raise RewardMasked(reason, StepResult("", None, True, info))
        score, mask_reason = float(masked_score), reason
    else:
        score, mask_reason = float(r.value), ""
    return {
        "score": score,
        "acc": float(bool(j.passed) and r.value is not None),
        "pass_fraction": float(j.fraction),
        "masked": float(r.value is None),
        "error_class": str(getattr(j.error_class, "value", j.error_class)),
        "mask_reason": mask_reason,
    }


def compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Judges ``solution_str`` against the task in ``ground_truth``; see the module docs.
    ``data_source`` is not used (verl routes by it; any source with code tests works)."""
    masked = _options(kwargs)
    scorer = _get_scorer()
    return _result(scorer.score([_task(ground_truth, extra_info)], [solution_str])[0], masked)


async def compute_score_async(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`compute_score` as a coroutine (verl's reward loop awaits it): the judgement
    runs on the evaluator's pool without blocking the loop."""
    masked = _options(kwargs)
    scorer = _get_scorer()
    scored = await scorer.ascore([_task(ground_truth, extra_info)], [solution_str])
    return _result(scored[0], masked)


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """The ``batch`` reward manager's form: every response judged at once, in parallel."""
    masked = _options(kwargs)
    n = len(solution_strs)
    if len(ground_truths) != n or len(data_sources) != n:
        raise ValueError("data_sources, solution_strs and ground_truths differ in length")
    extras = list(extra_infos) if extra_infos is not None else [None] * n
    if len(extras) != n:
        raise ValueError("extra_infos differs in length from solution_strs")
    tasks = [_task(g, e) for g, e in zip(ground_truths, extras, strict=True)]
    scored = _get_scorer().score(tasks, list(solution_strs))
    return [_result(s, masked) for s in scored]


def _close() -> None:
    """Drops the configuration (closing an evaluator made for it)."""
    set_shared_scorer(_KEY, None)
