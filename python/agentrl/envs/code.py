"""Code environments judged by :class:`agentrl.evaluation.Evaluator`: single-turn
(:class:`CodeEnv`) and multi-turn repair with feedback (:class:`CodeRepairEnv`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.envs.base import StepResult, TextEnv, action_text, check_field, trim_middle
from agentrl.envs.records import coerce_task

if TYPE_CHECKING:
    from agentrl.evaluation import Evaluator, Judgement, Task
    from agentrl.evaluation.rewards import Reward, RewardConfig

__all__ = ["CodeEnv", "CodeEnvConfig", "CodeRepairConfig", "CodeRepairEnv"]

DEFAULT_FEEDBACK = (
    "Your code did not pass the tests ({n_passed}/{n_cases} passed; {error_class}).\n\n"
    "{feedback}\n\n"
    "Fix it and answer with the complete corrected code ({turns_left} attempt(s) left)."
)


@dataclass(frozen=True)
class CodeEnvConfig:
    """Configuration of a :class:`CodeEnv`."""

    reward: RewardConfig | None = None
    """How a judgement becomes a reward (:func:`agentrl.evaluation.rewards.shape`); None: defaults."""
    extract_code: bool = True
    """Judge the code of the completion's markdown fence when it has one
    (:func:`agentrl.evaluation.rewards.extract_code`); the reward's format term sees the raw text."""
    prompt_template: str = "{prompt}"
    """The first observation; fields ``{prompt}`` and ``{task_id}``."""

    def __post_init__(self) -> None:
        _check_common_fields("CodeEnvConfig", self)


def _check_common_fields(owner: str, c: Any) -> None:
    from agentrl.evaluation.rewards import RewardConfig

    if c.reward is not None and not isinstance(c.reward, RewardConfig):
        raise TypeError(f"{owner}.reward must be a RewardConfig or None, got {c.reward!r}")
    check_field(owner, "extract_code", c.extract_code, "bool")
    check_field(owner, "prompt_template", c.prompt_template, "str")


@dataclass(frozen=True)
class CodeRepairConfig:
    """Configuration of a :class:`CodeRepairEnv`."""

    max_turns: int = 3
    """Turn budget: attempts the model gets, the first one included."""
    turn_discount: float = 1.0
    """The final reward is multiplied by ``turn_discount ** (turns - 1)``."""
    turn_penalty: float = 0.0
    """Then ``turn_penalty * (turns - 1)`` is subtracted from it."""
    reward: RewardConfig | None = None
    """How the final judgement becomes a reward; its pass fraction is the final one."""
    extract_code: bool = True
    """Judge the code of the completion's markdown fence when it has one."""
    prompt_template: str = "{prompt}"
    """The first observation; fields ``{prompt}`` and ``{task_id}``."""
    feedback_template: str = DEFAULT_FEEDBACK
    """The observation after a failed attempt; fields ``{feedback}`` (the failing test,
    the error class and a trimmed traceback), ``{n_passed}``, ``{n_cases}``,
    ``{error_class}``, ``{exception}``, ``{turn}``, ``{turns_left}``, ``{prompt}``."""
    max_feedback_chars: int = 2000
    """Characters of feedback shown (head and tail kept)."""

    def __post_init__(self) -> None:
        owner = "CodeRepairConfig"
        check_field(owner, "max_turns", self.max_turns, "int", low=1)
        check_field(owner, "turn_discount", self.turn_discount, "number", low=0.0, high=1.0)
        check_field(owner, "turn_penalty", self.turn_penalty, "number", low=0.0)
        check_field(owner, "max_feedback_chars", self.max_feedback_chars, "int", low=0)
        check_field(owner, "feedback_template", self.feedback_template, "str")
        _check_common_fields(owner, self)


def _evaluator(evaluator: Any) -> Evaluator:
    from agentrl.evaluation import Evaluator

    if not isinstance(evaluator, Evaluator):
        raise TypeError(f"evaluator must be an agentrl.evaluation.Evaluator, got {evaluator!r}")
    return evaluator


def _shape(j: Judgement, text: str, cfg: RewardConfig | None) -> Reward:
    from agentrl.evaluation.rewards import shape

    return shape(j, text, cfg)


def _code(text: str, extract: bool) -> str:
    if not extract:
        return text
    from agentrl.evaluation.rewards import extract_code

    return extract_code(text)


class _CodeEnvBase(TextEnv):
    def __init__(self, evaluator: Evaluator, config: Any) -> None:
        self.evaluator = _evaluator(evaluator)
        self.config = config
        self.task: Task | None = None
        self.turn = 0
        self.done = True

    def reset(self, task: Any) -> str:
        """Starts an episode of ``task`` (a FunctionTask/IOTask or a mapping of its fields)."""
        self.task = coerce_task(task)
        self.turn, self.done = 0, False
        return self.config.prompt_template.format(
            prompt=self.task.prompt, task_id=self.task.task_id
        )

    async def areset(self, task: Any) -> str:
        return self.reset(task)  # no sandbox work

    def _begin(self, action: Any) -> tuple[str, str]:
        if self.done or self.task is None:
            raise RuntimeError("the episode is over: call reset")
        text = action_text(action)
        self.turn += 1
        return text, _code(text, self.config.extract_code)

    def step(self, action: Any) -> StepResult:
        text, code = self._begin(action)
        assert self.task is not None
        return self._after(self.evaluator.judge(self.task, code), text)

    async def astep(self, action: Any) -> StepResult:
        """:meth:`step` with the judgement run on the evaluator's pool, on this loop."""
        text, code = self._begin(action)
        assert self.task is not None
        return self._after(await self.evaluator.ajudge(self.task, code), text)

    def _after(self, j: Judgement, text: str) -> StepResult:
        raise NotImplementedError

    def close(self) -> None:
        self.done = True  # the evaluator is borrowed

    async def aclose(self) -> None:
        self.close()


class CodeEnv(_CodeEnvBase):
    """Single-turn code generation: the observation is the task's prompt, the one step
    judges the completion and ends the episode with the shaped reward.

    ``info``: ``judgement`` (:class:`agentrl.evaluation.Judgement`), ``reward``
    (:class:`agentrl.evaluation.rewards.Reward`, with its components), ``masked`` (the reason when
    the sandbox failed and the reward is None, else None). The observation after the step
    is the judgement's feedback (empty when it passed).
    """

    def __init__(self, evaluator: Evaluator, config: CodeEnvConfig | None = None) -> None:
        if config is not None and not isinstance(config, CodeEnvConfig):
            raise TypeError("config must be a CodeEnvConfig")
        super().__init__(evaluator, config or CodeEnvConfig())

    def _after(self, j: Judgement, text: str) -> StepResult:
        self.done = True
        r = _shape(j, text, self.config.reward)
        info = {"judgement": j, "reward": r, "masked": r.reason if r.value is None else None}
        return StepResult("" if j.passed else j.feedback, r.value, True, info)


class CodeRepairEnv(_CodeEnvBase):
    """Multi-turn code repair: the model writes code, it runs, the environment answers with
    structured feedback (the failing test, the error class, a trimmed traceback) until all
    tests pass or ``max_turns`` attempts are spent.

    Every step but the last has reward 0.0; the last one's reward is the shaped reward of
    the final judgement (partial credit: its pass fraction), discounted for the turns taken
    (see :class:`CodeRepairConfig`), so an episode's total reward is its final reward.
    Each attempt is judged on its own (send the complete code each turn). A masked
    judgement (sandbox failure) ends the episode with reward None.

    ``info``: ``judgement``, ``reward`` (the shaped reward of this attempt), ``turn``,
    ``masked``; on the last step also ``turns`` and ``final_reward``.
    """

    def __init__(self, evaluator: Evaluator, config: CodeRepairConfig | None = None) -> None:
        if config is not None and not isinstance(config, CodeRepairConfig):
            raise TypeError("config must be a CodeRepairConfig")
        super().__init__(evaluator, config or CodeRepairConfig())

    def _after(self, j: Judgement, text: str) -> StepResult:
        c: CodeRepairConfig = self.config
        r = _shape(j, text, c.reward)
        info: dict[str, Any] = {"judgement": j, "reward": r, "turn": self.turn, "masked": None}
        if r.value is None:
            self.done = True
            info["masked"] = r.reason or "masked"
            return StepResult("", None, True, info)
        if j.passed or self.turn >= c.max_turns:
            self.done = True
            extra = self.turn - 1
            final = r.value * c.turn_discount**extra - c.turn_penalty * extra
            info["turns"], info["final_reward"] = self.turn, final
            obs = "" if j.passed else self._feedback(j, 0)
            return StepResult(obs, final, True, info)
        return StepResult(self._feedback(j, c.max_turns - self.turn), 0.0, False, info)

    def _feedback(self, j: Judgement, turns_left: int) -> str:
        c: CodeRepairConfig = self.config
        assert self.task is not None
        ec = j.error_class
        return c.feedback_template.format(
            feedback=trim_middle(j.feedback or "", c.max_feedback_chars),
            n_passed=j.n_passed,
            n_cases=j.n_cases,
            error_class=getattr(ec, "value", ec),
            exception=j.exception or "",
            turn=self.turn,
            turns_left=turns_left,
            prompt=self.task.prompt,
        )
