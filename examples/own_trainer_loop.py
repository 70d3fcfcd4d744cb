"""Your own RL loop on agentrl's ``RolloutScheduler``: the shape to copy into a trainer.

The scheduler runs many episodes at once: it batches the episodes that wait for an action
into one call of your ``generate``, runs each environment step (here: the code judged in
the sandbox by an ``Evaluator``) while other episodes generate, and hands you finished
groups (all samples of one task) to learn from. Your loop consumes groups, updates the
policy, and tells the scheduler the new policy version: ``max_staleness`` bounds how many
batches it starts ahead of the trainer (groups are delivered as they finish, so a slow one
can reach the trainer a version later still; each turn records the version that made it).

To keep it fast and readable the "model" is a toy: per task, a softmax over a few
candidate completions (one right, the others wrong in different ways), trained with
group-relative advantages (GRPO's baseline) and a REINFORCE step on its logits. Swap
``generate`` for your model's batched sampling and ``update`` for your optimiser step; the
scheduler part stays as it is.

Run it (as root, or under ``agentrl rootless --``); it needs no extra packages:

    python examples/own_trainer_loop.py

It prints one line per update (the policy's version, the oldest among the batch's rollouts,
the mean reward and pass rate), then the probability of the right answer before and after::

    step 1  policy v0 (rollouts from v0)  reward +0.04  pass   0%  episodes 24
    ...
    step 10 policy v9 (rollouts from v8)  reward +1.00  pass 100%  episodes 24
    P(correct) before: add 0.25, largest 0.25, shout 0.25
    P(correct) after:  add 0.99, largest 0.99, shout 0.99
    scheduler: 240 episodes, 0 failed, 0 masked, generator idle 92%
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random

from agentrl import Evaluator, FunctionTask, RolloutScheduler, SchedulerConfig
from agentrl.envs import CodeEnv

STEPS, GROUP_SIZE, LR = 10, 8, 2.0
# Per task: the prompt, the tests, and what the toy policy can answer: the right body first,
# then a wrong answer, a runtime error and a syntax error (the reward tells them apart).
TABLE = {
    "add": ("def add(a, b):\n", "assert add(1, 2) == 3\nassert add(0, 0) == 0\n",
            ["    return a + b\n", "    return a * b\n", "    return a / 0\n", "    return (a +\n"]),
    "largest": ("def largest(xs):\n", "assert largest([1, 5, 2]) == 5\nassert largest([-3]) == -3\n",
                ["    return max(xs)\n", "    return xs[1]\n", "    return xs[9]\n", "    max(\n"]),
    "shout": ("def shout(s):\n", "assert shout('hi') == 'HI!'\n",
              ["    return s.upper() + '!'\n", "    return s.upper()\n", "    return s + 1\n", "    retur\n"]),
}  # fmt: skip
TASKS = [FunctionTask(name, prompt, test, name) for name, (prompt, test, _) in TABLE.items()]
CANDIDATES = {name: answers for name, (_, _, answers) in TABLE.items()}


class ToyPolicy:
    """Logits over each task's candidates; ``version`` counts the updates."""

    def __init__(self, seed: int = 0) -> None:
        self.logits = {t: [0.0] * len(c) for t, c in CANDIDATES.items()}
        self.version = 0
        self.rng = random.Random(seed)

    def probs(self, task_id: str) -> list[float]:
        exps = [math.exp(x) for x in self.logits[task_id]]
        return [e / sum(exps) for e in exps]

    async def generate(self, episodes: list) -> list[str]:
        """The scheduler's ``generate``: one action per episode, in order. A real policy
        would run one batched forward pass here (or call an inference server)."""
        actions = []
        for ep in episodes:  # ep.task is the FunctionTask, ep.observation the prompt
            probs = self.probs(ep.task.task_id)
            choice = self.rng.choices(range(len(probs)), probs)[0]
            actions.append(CANDIDATES[ep.task.task_id][choice])
        return actions

    def update(self, groups: list) -> dict[str, float]:
        """One policy-gradient step on finished groups, GRPO style: each episode's advantage
        is its reward minus its group's mean, over the group's spread."""
        rewards, passed = [], []
        for group in groups:
            usable = group.usable  # not failed, not masked (a sandbox failure is no reward)
            rs = [ep.total_reward for ep in usable]
            if len(rs) < 2:
                continue
            mean = sum(rs) / len(rs)
            std = math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs)) or 1.0
            tid = group.task.task_id
            probs = self.probs(tid)
            for ep, r in zip(usable, rs, strict=True):
                action = CANDIDATES[tid].index(ep.turns[-1].action)
                for i, p in enumerate(probs):  # d log p(action) / d logit_i = [i == action] - p
                    self.logits[tid][i] += LR * (r - mean) / std * ((i == action) - p) / len(rs)
                rewards.append(r)
                passed.append(ep.turns[-1].info["judgement"].passed)
        self.version += 1
        n = max(1, len(rewards))
        return {"reward": sum(rewards) / n, "pass": sum(passed) / n, "episodes": len(rewards)}


def p_correct(policy: ToyPolicy) -> str:
    return ", ".join(f"{t.task_id} {policy.probs(t.task_id)[0]:.2f}" for t in TASKS)


async def main() -> None:
    policy = ToyPolicy()
    before = p_correct(policy)
    config = SchedulerConfig(batch_size=len(TASKS) * GROUP_SIZE, max_staleness=1)
    async with (
        Evaluator(workers=4, timeout=2.0) as evaluator,
        RolloutScheduler(
            policy.generate,
            # One environment per episode: reset(task) -> prompt, step(code) -> reward from the
            # sandbox. Any object with async or plain reset/step works; CodeEnv is agentrl's.
            lambda task: CodeEnv(evaluator).for_scheduler(),
            pool=evaluator.pool,
            config=config,
        ) as scheduler,
    ):
        scheduler.feed(itertools.cycle(TASKS), group_size=GROUP_SIZE)  # an endless stream
        batch, step = [], 0
        async for group in scheduler.groups():
            batch.append(group)
            if len(batch) < len(TASKS):
                continue
            # The policy versions that generated this batch (turn.version).
            oldest = min((e.turns[-1].version for g in batch for e in g.usable), default=-1)
            current = policy.version
            m = policy.update(batch)  # a real trainer: run this off the loop (an executor)
            scheduler.set_policy_version(policy.version)  # new weights: admit more rollouts
            step, batch = step + 1, []
            print(
                f"step {step:<2} policy v{current} (rollouts from v{oldest})  "
                f"reward {m['reward']:+.2f}  pass {m['pass']:4.0%}  episodes {m['episodes']}"
            )
            if step == STEPS:
                break
        stats = scheduler.stats()
    print(f"P(correct) before: {before}")
    print(f"P(correct) after:  {p_correct(policy)}")
    print(
        f"scheduler: {stats['episodes_finished']} episodes, {stats['episodes_failed']} failed, "
        f"{stats['episodes_masked']} masked, generator idle {stats['generator_idle_fraction']:.0%}"
    )


if __name__ == "__main__":
    asyncio.run(main())
