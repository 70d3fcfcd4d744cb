"""A shell/tool environment on a persistent sandbox :class:`agentrl.Session`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.base import StepResult, TextEnv, action_text, check_field, trim_middle
from agentrl.errors import SandboxError
from agentrl.pool.pool import SandboxPool
from agentrl.sandbox.box import Sandbox
from agentrl.sandbox.limits import Limits
from agentrl.sandbox.result import ExecResult, Status
from agentrl.sandbox.session import Session

__all__ = ["ShellEnv", "ShellEnvConfig", "ShellTask"]

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class ShellTask:
    """A task for :class:`ShellEnv`: files to start from and a way to tell it is solved."""

    instruction: str
    """What the agent is asked to do: the first observation."""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    """Initial contents of the session's work dir (``/work``), relative path -> content."""
    check: str | None = None
    """A shell command run in the session after each step; exit status 0 means solved.
    It is passed as an argument, so the agent cannot rewrite it (it can change the files
    it reads: keep the logic in the command or in :attr:`predicate`)."""
    collect: tuple[str, ...] = ()
    """Work dir files collected after each step and given to :attr:`predicate`."""
    predicate: Callable[[Mapping[str, bytes]], bool] | None = None
    """Success test run on the host against the collected files (missing ones are absent)."""
    task_id: str = ""
    """A name for logs."""

    def __post_init__(self) -> None:
        if not isinstance(self.instruction, str):
            raise TypeError("instruction must be a str")
        if self.check is not None and not isinstance(self.check, str):
            raise TypeError("check must be a shell command (str) or None")
        if isinstance(self.collect, str):
            raise TypeError("collect must be a sequence of paths, not a single string")
        object.__setattr__(self, "collect", tuple(self.collect))
        if self.predicate is not None and not callable(self.predicate):
            raise TypeError("predicate must be callable")
        if self.collect and self.predicate is None:
            raise ValueError("collect is only used by predicate; give one")

    @classmethod
    def coerce(cls, task: Any) -> ShellTask:
        """A :class:`ShellTask` from itself, a mapping of its fields, or an instruction str."""
        if isinstance(task, ShellTask):
            return task
        if isinstance(task, str):
            return cls(task)
        if isinstance(task, Mapping):
            return cls(**task)
        raise TypeError(f"a shell task must be a ShellTask, mapping or str, got {type(task)}")


@dataclass(frozen=True)
class ShellEnvConfig:
    """Configuration of a :class:`ShellEnv`."""

    max_steps: int = 16
    """Commands per episode; after the last one the episode ends unsolved."""
    max_output_chars: int = 4000
    """Characters of stdout/stderr shown per step (the head and the tail are kept)."""
    limits: Limits | None = None
    """Limits of each command (default: the sandbox's)."""
    cpu_budget_s: float | None = None
    """CPU time of all commands of one episode together; when spent, the episode ends
    unsolved. None: no budget."""
    disk_bytes: int | None = None
    """What the commands may write to the work dir (default: the limits' tmpfs size)."""
    shell: str = "sh"
    """The shell that runs each command (``shell -c command``)."""
    success_reward: float = 1.0
    """Reward of the step after which the task is solved."""
    failure_reward: float = 0.0
    """Reward added when the episode ends unsolved (step or CPU budget spent)."""
    step_penalty: float = 0.0
    """Subtracted from the reward of every step."""
    extract_fenced: bool = True
    """When the action holds a markdown code fence, run the fence's content."""

    def __post_init__(self) -> None:
        owner = "ShellEnvConfig"
        check_field(owner, "max_steps", self.max_steps, "int", low=1)
        check_field(owner, "max_output_chars", self.max_output_chars, "int", low=0)
        if self.limits is not None and not isinstance(self.limits, Limits):
            raise TypeError(f"{owner}.limits must be agentrl.Limits, got {self.limits!r}")
        if self.cpu_budget_s is not None:
            check_field(owner, "cpu_budget_s", self.cpu_budget_s, "number", low=0.0)
        if self.disk_bytes is not None:
            check_field(owner, "disk_bytes", self.disk_bytes, "int", low=1)
        check_field(owner, "shell", self.shell, "str")
        if not self.shell:
            raise ValueError(f"{owner}.shell is empty")
        for name in ("success_reward", "failure_reward", "step_penalty"):
            check_field(owner, name, getattr(self, name), "number")
        check_field(owner, "extract_fenced", self.extract_fenced, "bool")


class ShellEnv(TextEnv):
    """Commands in, outputs out, in a persistent sandbox session.

    Each action is a shell command run with ``sh -c`` in the session (the work dir persists
    between steps, processes do not); the observation is its trimmed stdout, stderr and exit
    status. The episode ends when the task's check passes (``success_reward``), or when the
    step or CPU budget is spent. ``reset`` with the same task's files resets the session in
    O(1) (an overlay reset); another task's files get a fresh session.

    ``sandbox``: the :class:`agentrl.Sandbox` (or the sandbox of a :class:`SandboxPool`) the
    session lives on. The async variants run the steps in a thread: sessions run on the
    sandbox's slots, not as pool jobs.
    """

    def __init__(self, sandbox: Sandbox | SandboxPool, config: ShellEnvConfig | None = None):
        if isinstance(sandbox, SandboxPool):
            sandbox = sandbox.sandbox
        if not isinstance(sandbox, Sandbox):
            raise TypeError(f"sandbox must be a Sandbox or SandboxPool, got {type(sandbox)}")
        if config is not None and not isinstance(config, ShellEnvConfig):
            raise TypeError("config must be a ShellEnvConfig")
        self.sandbox = sandbox
        self.config = config or ShellEnvConfig()
        self.task: ShellTask | None = None
        self.steps = 0
        self.done = True
        self._session: Session | None = None
        self._files: Mapping[str, str | bytes] | None = None
        self._cpu_used = 0.0

    @property
    def session(self) -> Session | None:
        """The current episode's session."""
        return self._session

    def reset(self, task: Any = None) -> str:
        """Starts an episode of ``task`` (a :class:`ShellTask`, a mapping of its fields or an
        instruction); None restarts the current task."""
        if task is None:
            if self.task is None:
                raise ValueError("no task to restart: give one")
            task = self.task
        task = ShellTask.coerce(task)
        files = task.files
        if self._session is not None and (files is self._files or files == self._files):
            self._session.reset()
        else:
            self._close_session()
            c = self.config
            self._session = self.sandbox.session(dict(files), c.limits, disk_bytes=c.disk_bytes)
            self._files = files
        self.task, self.steps, self.done = task, 0, False
        self._cpu_used = 0.0
        return task.instruction

    def _command(self, action: Any) -> str:
        text = action_text(action)
        if self.config.extract_fenced:
            m = _FENCE.search(text)
            if m:
                text = m.group(1)
        return text.strip()

    def step(self, action: Any) -> StepResult:
        if self.done or self._session is None or self.task is None:
            raise RuntimeError("the episode is over: call reset")
        c, task = self.config, self.task
        command = self._command(action)
        self.steps += 1
        info: dict[str, Any] = {"command": command, "masked": None, "solved": False}
        if not command:
            obs = "(empty command: nothing ran)"
        else:
            if self._budget_spent():
                return self._end(info, "[the episode's CPU budget is spent]", budget=True)
            try:
                r = self._session.run(
                    [c.shell, "-c", command], collect=task.collect, limits=self._limits()
                )
            except SandboxError as e:
                return self._masked(info, f"sandbox error: {e}")
            if r.status is Status.SANDBOX_ERROR:
                return self._masked(info, f"sandbox error: {r.error}")
            self._cpu_used += r.cpu_time_s
            info["result"] = r
            obs = self._render(r)
            solved = self._check(r, info)
            if solved is None:
                return self._masked(info, str(info["masked_reason"]))
            if solved:
                info["solved"] = True
                self.done = True
                return StepResult(obs, c.success_reward - c.step_penalty, True, info)
            if self._budget_spent():
                spent = obs + "\n[the episode's CPU budget is spent]"
                return self._end(info, spent, budget=True)
        if self.steps >= c.max_steps:
            return self._end(info, obs)
        return StepResult(obs, 0.0 - c.step_penalty, False, info)

    def _budget_spent(self) -> bool:
        b = self.config.cpu_budget_s
        return b is not None and self._cpu_used >= b

    def _limits(self) -> Limits:
        """The next command's limits: its CPU time bounded by what is left of the budget."""
        lim = self.config.limits or self.sandbox.limits
        b = self.config.cpu_budget_s
        if b is None:
            return lim
        left = b - self._cpu_used
        return lim.replace(cpu_time_s=max(0.001, min(lim.cpu_time_s, left)))

    def _end(self, info: dict[str, Any], obs: str, budget: bool = False) -> StepResult:
        c = self.config
        self.done = True
        info["budget_spent"] = budget
        return StepResult(obs, c.failure_reward - c.step_penalty, True, info)

    def _masked(self, info: dict[str, Any], reason: str) -> StepResult:
        self.done = True
        info["masked"] = reason
        info.pop("masked_reason", None)
        return StepResult("", None, True, info)

    def _check(self, r: ExecResult, info: dict[str, Any]) -> bool | None:
        """Whether the task is solved after this step; None when the check itself failed
        for an infrastructure reason (``info["masked_reason"]``)."""
        task = self.task
        assert task is not None and self._session is not None
        if task.predicate is not None and not task.predicate(dict(r.files)):
            return False
        if task.check is not None:
            try:
                cr = self._session.run([self.config.shell, "-c", task.check])
            except SandboxError as e:
                info["masked_reason"] = f"sandbox error in the check: {e}"
                return None
            info["check"] = cr
            if cr.status is Status.SANDBOX_ERROR:
                info["masked_reason"] = f"sandbox error in the check: {cr.error}"
                return None
            return cr.ok
        return task.predicate is not None

    def _render(self, r: ExecResult) -> str:
        limit = self.config.max_output_chars
        out = r.stdout.decode("utf-8", "replace")
        err = r.stderr.decode("utf-8", "replace")
        parts = []
        if out:
            parts.append(trim_middle(out, limit).rstrip("\n"))
        if err:
            parts.append("[stderr]\n" + trim_middle(err, limit).rstrip("\n"))
        if r.status is Status.OK:
            parts.append("[exit status 0]")
        elif r.status is Status.RUNTIME_ERROR:
            parts.append(f"[exit status {r.exit_code}]")
        elif r.status is Status.SIGNALED:
            parts.append(f"[killed by signal {r.signal}]")
        else:
            parts.append(f"[{r.status.value}{f': {r.limit}' if r.limit else ''}]")
        if r.stdout_truncated or r.stderr_truncated:
            parts.append("[output cut at the sandbox's cap]")
        return "\n".join(parts)

    def _close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
            self._files = None

    def close(self) -> None:
        self._close_session()
        self.done = True

    def __repr__(self) -> str:
        tid = self.task.task_id if self.task else None
        return f"<agentrl.ShellEnv task={tid!r} steps={self.steps} done={self.done}>"
