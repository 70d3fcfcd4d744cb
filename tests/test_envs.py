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
    RewardMasked,
    ShellEnv,
    ShellEnvConfig,
    ShellTask,
    StepResult,
    action_text,
    trim_middle,
)

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


def test_scheduler_view_raises_masked(shell_sb: Sandbox) -> None:
    async def main() -> None:
        env = ShellEnv(shell_sb)
        view = env.for_scheduler()
        await view.reset(FIX_TASK)
        assert env.session is not None
        env.session.close()
        with pytest.raises(RewardMasked) as ei:
            await view.step("ls")
        assert "closed" in ei.value.reason and ei.value.result.reward is None
        await view.close()

    asyncio.run(main())
