"""The scripts of ``examples/``, each run as a user runs it: a new process of this
interpreter, from a scratch working directory, checked for its exit status and for what its
docstring says it prints. The ones that need TRL or verl are skipped where those are not
installed; ``examples/README.md`` must list every script with its command."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import TIME_SCALE

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = ("sandbox_api.py", "own_trainer_loop.py", "trl_grpo.py", "verl/score_batch.py")
"""Every script of examples/, each run by a test below."""
MAX_LINES = 150


def run(script: str, cwd: Path, *flags: str, timeout: float = 240.0) -> str:
    """Runs ``python [flags] examples/<script>`` in ``cwd``; its stdout, once it exited 0."""
    r = subprocess.run(
        [sys.executable, *flags, str(EXAMPLES / script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout * TIME_SCALE,
    )
    assert r.returncode == 0, (
        f"{script} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    )
    return r.stdout


def labelled(out: str) -> dict[str, str]:
    """``label: value`` lines of a script's output as a dict."""
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in out.splitlines())}


def missing(*modules: str) -> str | None:
    gone = [m for m in modules if find_spec(m) is None]
    return f"not installed: {', '.join(gone)}" if gone else None


def test_every_example_is_listed_run_and_short() -> None:
    on_disk = {p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.py")}
    assert on_disk == set(SCRIPTS), "a script of examples/ without its test here, or the reverse"
    index = (EXAMPLES / "README.md").read_text()
    for script in SCRIPTS:
        source = (EXAMPLES / script).read_text()
        command = f"python examples/{script}"
        assert command in index, f"examples/README.md does not give `{command}`"
        doc = ast.get_docstring(ast.parse(source)) or ""
        assert command in doc, f"{script}'s docstring does not say how to run it"
        assert "prints" in doc, f"{script}'s docstring does not say what it prints"
        assert len(source.splitlines()) <= MAX_LINES, f"{script} is over {MAX_LINES} lines"
    assert (EXAMPLES / "verl" / "agentrl_reward.yaml").name in index


def test_sandbox_api(tmp_path: Path) -> None:
    out = run("sandbox_api.py", tmp_path, "-W", "error")
    got = labelled(out)
    assert got["cold run"].startswith("ok b'45\\n' (status=ok exit=0")
    assert got["warm run"] == "ok b'hello from a warm fork\\n'"
    assert got["memory bomb"] == "memory_limit limit=memory"
    assert re.fullmatch(r"timeout limit=(cpu_time|wall_time)", got["busy loop"])
    assert got["files"] == "ok out.txt=b'HELLO\\n'"
    assert got["session"] == "exists after rm -rf: False; runs after restore: True"
    assert got["pool batch"] == str([i * i for i in range(8)])
    assert got["asyncio"] == str([f"task {i} ok" for i in range(3)])
    assert out.splitlines()[-1] == "all steps passed"


STEP = re.compile(
    r"step (\d+) +policy v(\d+) \(rollouts from v(\d+)\)  reward ([+-][\d.]+)  "
    r"pass +(\d+)%  episodes (\d+)"
)


def test_own_trainer_loop(tmp_path: Path) -> None:
    out = run("own_trainer_loop.py", tmp_path, "-W", "error")
    steps = [tuple(map(float, m.groups())) for m in STEP.finditer(out)]
    assert [int(s[0]) for s in steps] == list(range(1, 11)), out
    for _, current, oldest, _, _, episodes in steps:
        assert 0 <= oldest <= current  # no rollout of a policy the trainer has not made
        assert episodes == 24  # 3 groups of 8, none failed or masked
    assert [s[1] for s in steps] == list(range(10))  # one policy version per update
    # set_policy_version reaches generation: the last batch comes from recent policies (the
    # admission bound is max_staleness=1 batch ahead; a group that finishes late can reach
    # the trainer a version later than that, so no tighter bound is asserted).
    assert steps[-1][2] >= 6, steps
    got = labelled(out)

    def probs(line: str) -> dict[str, float]:
        return {k: float(v) for k, v in (p.split() for p in line.split(", "))}

    before, after = probs(got["P(correct) before"]), probs(got["P(correct) after"])
    assert before == {"add": 0.25, "largest": 0.25, "shout": 0.25}
    assert all(p > 0.8 for p in after.values()), after  # it learned every task
    assert steps[-1][3] > steps[0][3] + 0.5  # and the reward rose with it
    assert re.fullmatch(r"\d+ episodes, 0 failed, 0 masked, generator idle \d+%", got["scheduler"])


@pytest.mark.skipif(
    bool(missing("trl", "datasets", "transformers", "torch")),
    reason=str(missing("trl", "datasets", "transformers", "torch")),
)
def test_trl_grpo(tmp_path: Path) -> None:
    out = run("trl_grpo.py", tmp_path)
    got = labelled(out)
    assert got["reward of known completions"] == "[1.0, 0.333, -0.5]"
    for step in ("step 1", "step 2"):  # TRL logged the reward function's metrics each step
        assert re.fullmatch(
            r"rewards/agentrl_code/mean=\S+ agentrl_code/pass_rate=0 agentrl_code/masked=0",
            got[step],
        ), got.get(step)
    assert out.splitlines()[-1] == "trained 2 steps; judged 4 completions in the last step"


@pytest.mark.skipif(bool(missing("verl", "omegaconf")), reason=str(missing("verl", "omegaconf")))
def test_verl_config_scores_a_batch(tmp_path: Path) -> None:
    out = run("verl/score_batch.py", tmp_path)
    lines = out.splitlines()
    assert lines[0] == (
        "reward fn: compute_score_async from pkg://agentrl.integrations.verl (manager: naive)"
    )
    rows = [ln.split()[:5] for ln in lines[1:5]]
    assert rows == [
        ["score", "+1.000", "passed", "masked", "0.0"],
        ["score", "+0.333", "wrong_answer", "masked", "0.0"],
        ["score", "+1.000", "passed", "masked", "0.0"],
        ["score", "+1.000", "passed", "masked", "0.0"],
    ]
    assert lines[5] == "rm_scores row sums: [1.0, 0.333, 1.0, 1.0]"
