"""Environment episodes on real sandboxes: the shell env on sessions, the code envs on an
Evaluator, and the RolloutScheduler driving them with scripted "models"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from agentrl import EpisodeStatus, Limits, RolloutScheduler, Sandbox, SchedulerConfig
from agentrl.envs import (
    CodeEnv,
    CodeEnvConfig,
    CodeRepairConfig,
    CodeRepairEnv,
    ShellEnv,
    ShellEnvConfig,
    ShellTask,
    StepResult,
    action_text,
    trim_middle,
)
from agentrl.evaluation import Evaluator, FunctionTask, IOCase, IOTask
from agentrl.evaluation.rewards import RewardConfig
from conftest import FlakyEvaluator

# ---------------------------------------------------------------- protocol helpers


def test_step_result_unpacks_as_the_scheduler_expects() -> None:
    r = StepResult("obs", 0.5, True, {"k": 1})
    obs, reward, done, info = r
    assert (obs, reward, done, info) == ("obs", 0.5, True, {"k": 1})
    assert not r.masked and StepResult("", None, True).masked


def test_action_text_forms() -> None:
    assert action_text("x = 1") == "x = 1"
    assert action_text({"role": "assistant", "content": "a"}) == "a"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]
    assert action_text(msgs) == "b"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "c"}, "d"]}]
    assert action_text(parts) == "cd"
    with pytest.raises(TypeError):
        action_text(3)
    with pytest.raises(TypeError):
        action_text(["not a message"])


def test_trim_middle_keeps_head_and_tail() -> None:
    text = "H" * 50 + "m" * 1000 + "T" * 50
    out = trim_middle(text, 150)
    assert out.startswith("H" * 50) and out.endswith("T" * 50)
    assert "1000 characters cut" not in out and "characters cut" in out
    assert len(out) < 220
    assert trim_middle("short", 150) == "short"


# ---------------------------------------------------------------- shell env

FIX_TASK = ShellTask(
    "Make greet.sh print 'hello world'.",
    files={"greet.sh": "echo hello wrld\n", "notes/readme.txt": "keep me\n"},
    check='test "$(sh greet.sh)" = "hello world"',
    task_id="fix-greet",
)


@pytest.fixture(scope="module")
def shell_sb() -> Iterator[Sandbox]:
    with Sandbox(Limits(wall_time_s=5, cpu_time_s=2, memory_bytes=256 << 20)) as sb:
        yield sb


def test_shell_episode_solves_and_reset_restores_files(shell_sb: Sandbox) -> None:
    cfg = ShellEnvConfig(max_steps=5, step_penalty=0.1, success_reward=1.0)
    with ShellEnv(shell_sb, cfg) as env:
        assert env.reset(FIX_TASK) == FIX_TASK.instruction
        r = env.step("cat greet.sh; ls")
        assert r.observation == "echo hello wrld\ngreet.sh\nnotes\n[exit status 0]"
        assert (r.reward, r.done, r.info["solved"]) == (pytest.approx(-0.1), False, False)
        r = env.step({"role": "assistant", "content": "```sh\nls missing\n```"})
        assert r.info["command"] == "ls missing"
        assert "[stderr]" in r.observation and "[exit status " in r.observation
        assert r.info["result"].exit_code != 0 and not r.done
        r = env.step("echo 'echo hello world' > greet.sh && rm notes/readme.txt")
        assert r.done and r.info["solved"] and r.reward == pytest.approx(0.9)
        assert r.info["check"].ok
        with pytest.raises(RuntimeError, match="reset"):
            env.step("true")
        session = env.session
        t0 = time.perf_counter()
        env.reset(FIX_TASK)
        reset_s = time.perf_counter() - t0
        assert env.session is session, "same files: the session is reset, not recreated"
        r = env.step("cat greet.sh notes/readme.txt")
        assert r.observation == "echo hello wrld\nkeep me\n[exit status 0]", reset_s
        assert env.steps == 1


def test_shell_new_files_get_a_new_session_and_budget_ends_unsolved(shell_sb: Sandbox) -> None:
    cfg = ShellEnvConfig(max_steps=2, failure_reward=-1.0)
    with ShellEnv(shell_sb, cfg) as env:
        env.reset(FIX_TASK)
        first = env.session
        env.reset({"instruction": "nothing", "files": {"x": "1"}, "check": "false"})
        assert env.session is not first
        r = env.step("cat x")
        assert r.observation == "1\n[exit status 0]"
        assert not r.done and r.reward == 0.0
        r = env.step("")  # an empty command still takes a step
        assert r.done and not r.info["solved"] and r.reward == -1.0
        assert "empty command" in r.observation


def test_shell_predicate_on_collected_files(shell_sb: Sandbox) -> None:
    def has_answer(files: Any) -> bool:
        return files.get("answer.txt", b"").strip() == b"42"

    task = ShellTask("Write 42 to answer.txt", collect=("answer.txt",), predicate=has_answer)
    with ShellEnv(shell_sb) as env:
        env.reset(task)
        assert not env.step("echo 41 > answer.txt").done
        r = env.step("echo 42 > answer.txt")
        assert r.done and r.info["solved"] and r.reward == 1.0
        assert "check" not in r.info  # no check command: the predicate decides alone


def test_shell_cpu_budget_and_output_trimming(shell_sb: Sandbox) -> None:
    cfg = ShellEnvConfig(cpu_budget_s=0.3, max_output_chars=200, max_steps=10)
    with ShellEnv(shell_sb, cfg) as env:
        env.reset(ShellTask("spin", check="false"))
        r = env.step("head -c 5000 /dev/zero | tr '\\0' a")
        assert "characters cut" in r.observation and len(r.observation) < 400
        r = env.step("while :; do :; done")
        assert r.done and r.info["budget_spent"] and "timeout: cpu_time" in r.observation
        assert r.info["result"].cpu_time_s < 1.0
        # The next episode has a fresh budget.
        env.reset(None)
        r = env.step("echo again")
        assert r.observation.startswith("again") and not r.done


def test_shell_infrastructure_failure_is_masked(shell_sb: Sandbox) -> None:
    with ShellEnv(shell_sb) as env:
        env.reset(FIX_TASK)
        assert env.session is not None
        env.session.close()  # the session vanishes under the environment
        r = env.step("ls")
        assert r.reward is None and r.done and r.masked
        assert "closed" in r.info["masked"]


def test_shell_task_validation() -> None:
    with pytest.raises(TypeError):
        ShellTask(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="predicate"):
        ShellTask("x", collect=("a",))
    with pytest.raises(TypeError):
        ShellTask("x", collect="a")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ShellEnvConfig(max_steps=0)
    with pytest.raises(TypeError):
        ShellEnv("not a sandbox")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cls, field, bad",
    [
        (CodeEnvConfig, "reward", {"partial_credit": False}),
        (CodeEnvConfig, "extract_code", "no"),
        (CodeEnvConfig, "prompt_template", None),
        (CodeRepairConfig, "max_turns", 0),
        (CodeRepairConfig, "turn_discount", float("nan")),
        (CodeRepairConfig, "turn_discount", 1.5),
        (CodeRepairConfig, "turn_penalty", True),
        (CodeRepairConfig, "max_feedback_chars", 2.5),
        (CodeRepairConfig, "feedback_template", 5),
        (ShellEnvConfig, "max_output_chars", -1),
        (ShellEnvConfig, "cpu_budget_s", "1s"),
        (ShellEnvConfig, "disk_bytes", 0),
        (ShellEnvConfig, "shell", ""),
        (ShellEnvConfig, "success_reward", float("inf")),
        (ShellEnvConfig, "extract_fenced", 1),
    ],
)
def test_env_configs_name_the_bad_field(cls: type, field: str, bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match=f"{cls.__name__}.{field}"):
        cls(**{field: bad})


def test_scheduler_drives_shell_env(shell_sb: Sandbox) -> None:
    """Two groups of shell episodes, the "model" scripted by turn number."""
    script = ["ls", "echo 'echo hello world' > greet.sh"]

    def generate(episodes: list[Any]) -> list[str]:
        return [script[min(len(ep.turns), 1)] for ep in episodes]

    async def main() -> list[Any]:
        out = []
        async with RolloutScheduler(
            generate,
            lambda task: ShellEnv(shell_sb).for_scheduler(),
            config=SchedulerConfig(batch_size=4, max_turns=5),
        ) as sched:
            sched.feed([FIX_TASK, FIX_TASK], group_size=2)
            async for g in sched.groups():
                out.append(g)
        return out

    groups = asyncio.run(main())
    assert len(groups) == 2
    for g in groups:
        for ep in g.episodes:
            assert ep.status is EpisodeStatus.DONE, ep.error
            assert [t.action for t in ep.turns] == script
            assert ep.total_reward == 1.0 and ep.turns[-1].info["solved"]


def test_scheduler_view_keeps_masked(shell_sb: Sandbox) -> None:
    async def main() -> None:
        env = ShellEnv(shell_sb)
        view = env.for_scheduler()
        await view.reset(FIX_TASK)
        assert env.session is not None
        env.session.close()
        r = await view.step("ls")
        assert r.reward is None and r.done and "closed" in r.info["masked"]
        await view.close()

    asyncio.run(main())


# ---------------------------------------------------------------- code envs

ADD = FunctionTask(
    task_id="add",
    prompt='def add(a, b):\n    """The sum of a and b."""\n',
    test=(
        "def check(candidate):\n"
        "    assert candidate(1, 2) == 3\n"
        "    assert candidate(0, 0) == 0\n"
        "    assert candidate(-1, 1) == 0\n"
    ),
    entry_point="add",
)
ECHO = IOTask("echo-sum", "Print the sum of two integers.", (IOCase("1 2\n", "3\n"),))
GOOD = "    return a + b\n"
HALF = "    return a * b\n"  # passes only the 0 + 0 case: 1 of 3
CRASH = "    return a / 0\n"


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with FlakyEvaluator(workers=4, timeout=3.0) as ev:
        yield ev


def test_code_env_single_turn(evaluator: Evaluator) -> None:
    env = CodeEnv(evaluator, CodeEnvConfig(prompt_template="[{task_id}]\n{prompt}"))
    assert env.reset(ADD) == "[add]\n" + ADD.prompt
    r = env.step(GOOD)
    assert r.done and r.reward == pytest.approx(1.0) and r.observation == ""
    assert r.info["judgement"].passed and r.info["masked"] is None
    with pytest.raises(RuntimeError):
        env.step(GOOD)
    env.reset(ADD)
    r = env.step(HALF)
    j = r.info["judgement"]
    assert r.done and not j.passed and (j.n_passed, j.n_cases) == (1, 3)
    assert r.reward == pytest.approx(1 / 3) and "returned 2" in r.observation
    # A chat message holding a fenced full definition: the code is extracted.
    env.reset(ADD)
    msg = {
        "role": "assistant",
        "content": "Here:\n```python\ndef add(a, b):\n    return b + a\n```",
    }
    assert env.step(msg).info["judgement"].passed
    # A stdin/stdout task, from its record.
    env.reset({"task_id": "io", "prompt": "sum", "cases": [{"input": "2 5\n", "output": "7\n"}]})
    assert env.step("print(sum(map(int, input().split())))").reward == pytest.approx(1.0)


def test_code_env_reward_config_applies(evaluator: Evaluator) -> None:
    cfg = CodeEnvConfig(reward=RewardConfig(partial_credit=False, format_weight=0.25))
    env = CodeEnv(evaluator, cfg)
    env.reset(ADD)
    r = env.step(HALF)
    assert r.reward == pytest.approx(0.0)  # all or nothing, no fence
    env.reset(ADD)
    r = env.step("```python\n" + GOOD + "```")
    assert r.reward == pytest.approx(1.25) and r.info["reward"].components["format"] == 0.25


def test_code_repair_succeeds_on_turn_two(evaluator: Evaluator) -> None:
    cfg = CodeRepairConfig(max_turns=3, turn_discount=0.8, turn_penalty=0.05)
    env = CodeRepairEnv(evaluator, cfg)
    env.reset(ADD)
    r = env.step(CRASH)
    assert not r.done and r.reward == 0.0 and r.info["turn"] == 1
    obs = r.observation
    assert "runtime_error" in obs and "ZeroDivisionError" in obs and "Traceback" in obs
    assert "candidate(1, 2)" in obs and "2 attempt(s) left" in obs
    r = env.step(GOOD)
    assert r.done and r.info["turns"] == 2 and r.info["judgement"].passed
    assert r.reward == pytest.approx(1.0 * 0.8 - 0.05) == r.info["final_reward"]


def test_code_repair_budget_exhaustion_uses_final_fraction(evaluator: Evaluator) -> None:
    env = CodeRepairEnv(evaluator, CodeRepairConfig(max_turns=2, turn_discount=0.5))
    env.reset(ADD)
    r = env.step(CRASH)
    assert not r.done
    r = env.step(HALF)  # the last attempt: 1 of 3 passed
    assert r.done and r.info["turns"] == 2 and not r.info["judgement"].passed
    assert r.reward == pytest.approx((1 / 3) * 0.5)
    assert "1 of 3 tests passed" in r.observation and "0 attempt(s) left" in r.observation
    with pytest.raises(RuntimeError):
        env.step(GOOD)
    with pytest.raises(ValueError):
        CodeRepairConfig(max_turns=0)
    with pytest.raises(ValueError):
        CodeRepairConfig(turn_discount=1.5)


def test_code_envs_mask_infrastructure_failures(evaluator: Evaluator) -> None:
    flaky = FunctionTask("flaky-add", ADD.prompt, ADD.test, "add")
    env = CodeEnv(evaluator)
    env.reset(flaky)
    r = env.step(GOOD)
    assert r.reward is None and r.done and "sandbox" in r.info["masked"]
    assert evaluator._served  # the function task went through the persistent judge's path
    rep = CodeRepairEnv(evaluator)
    rep.reset(flaky)
    r = rep.step(CRASH)
    assert r.reward is None and r.done and r.info["masked"]
    assert asyncio.run(_astep(CodeEnv(evaluator), flaky, GOOD)).reward is None


async def _astep(env: CodeEnv, task: Any, action: str) -> StepResult:
    await env.areset(task)
    return await env.astep(action)


def test_code_env_async_matches_sync(evaluator: Evaluator) -> None:
    for action, want in ((GOOD, 1.0), (HALF, 1 / 3)):
        r = asyncio.run(_astep(CodeEnv(evaluator), ADD, action))
        assert r.reward == pytest.approx(want)
    r = asyncio.run(
        _astep(CodeEnv(evaluator), ECHO, "a, b = map(int, input().split())\nprint(a+b)")
    )
    assert r.reward == pytest.approx(1.0)


def test_scheduler_drives_code_envs(evaluator: Evaluator) -> None:
    """Groups of single-turn and repair episodes through the RolloutScheduler, judged on
    the evaluator's pool from the scheduler's loop; a masked episode fails with the reason."""
    answers = {0: GOOD, 1: HALF, 2: CRASH, 3: GOOD}
    repair_task = FunctionTask("add-repair", ADD.prompt, ADD.test, "add")
    flaky_task = FunctionTask("flaky-add", ADD.prompt, ADD.test, "add")

    async def generate(episodes: list[Any]) -> list[str]:
        out = []
        for ep in episodes:
            if ep.task is repair_task:  # crash first, then fix
                out.append(GOOD if ep.turns else CRASH)
            else:
                out.append(answers[ep.index])
        return out

    def make_env(task: Any) -> Any:
        if task is repair_task:
            return CodeRepairEnv(evaluator, CodeRepairConfig(max_turns=3)).for_scheduler()
        return CodeEnv(evaluator).for_scheduler()

    async def main() -> dict[str, Any]:
        groups = {}
        async with RolloutScheduler(
            generate, make_env, pool=evaluator.pool, config=SchedulerConfig(batch_size=8)
        ) as sched:
            sched.feed([ADD, repair_task, flaky_task], group_size=1)
            sched.submit_group(ADD, 4)
            async for g in sched.groups():
                groups.setdefault(g.task.task_id, []).append(g)
        return groups

    groups = asyncio.run(main())
    single = next(g for g in groups["add"] if len(g.episodes) == 4)
    rewards = [ep.total_reward for ep in sorted(single.episodes, key=lambda e: e.index)]
    assert rewards == pytest.approx([1.0, 1 / 3, 0.0, 1.0])
    assert all(ep.status is EpisodeStatus.DONE for ep in single.episodes)
    assert single.episodes[1].turns[0].info["judgement"].n_passed == 1
    (repair,) = groups["add-repair"][0].episodes
    assert repair.status is EpisodeStatus.DONE and len(repair.turns) == 2
    assert [t.reward for t in repair.turns] == [0.0, 1.0]
    assert "ZeroDivisionError" in repair.turns[1].observation  # the feedback it answered
    (masked,) = groups["flaky-add"][0].episodes
    assert masked.status is EpisodeStatus.DONE and masked.error is None
    assert masked.masked and masked.total_reward is None and masked.turns[-1].reward is None
    assert "sandbox" in (masked.mask_reason or "")
    assert groups["flaky-add"][0].usable == []
