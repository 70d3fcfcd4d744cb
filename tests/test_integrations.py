"""Trainer adapters called exactly as the trainers call them: TRL's GRPOTrainer (its own
reward path, and one real training step of a tiny random model on CPU) and verl's reward
managers (naive, batch, and the async reward loop's), on a real Evaluator."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentrl.evaluation import Evaluator, FunctionTask
from agentrl.integrations import verl as verl_adapter
from agentrl.integrations.trl import AsyncCodeReward, CodeReward
from conftest import FlakyEvaluator


def _quiet_import(name: str) -> Any:
    with warnings.catch_warnings():  # third-party deprecation warnings at import time
        warnings.simplefilter("ignore")
        return pytest.importorskip(name)


torch = _quiet_import("torch")

PROMPT = 'def add(a, b):\n    """The sum of a and b."""\n'
TEST = (
    "def check(candidate):\n"
    "    assert candidate(1, 2) == 3\n"
    "    assert candidate(0, 0) == 0\n"
    "    assert candidate(-1, 1) == 0\n"
)
ROW = {"task_id": "add", "test": TEST, "entry_point": "add"}
GOOD = "    return a + b\n"
HALF = "    return a * b\n"
FENCED = "```python\ndef add(a, b):\n    return b + a\n```"


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    with FlakyEvaluator(workers=4, timeout=3.0) as ev:
        yield ev


def char_tokenizer() -> Any:
    """A character-level fast tokenizer built in memory (no download)."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


# ---------------------------------------------------------------- adapters alone


def test_code_reward_columns_and_forms(evaluator: Evaluator) -> None:
    f = CodeReward(evaluator, tasks=[FunctionTask("add", PROMPT, TEST, "add")])
    assert f.__name__ == "agentrl_code"
    # Task from a task_id column resolved in the table; TRL's prompt is chat (not code).
    chat = [[{"role": "user", "content": "write add"}]] * 3
    comps = [
        [{"role": "assistant", "content": FENCED}],
        [{"role": "assistant", "content": "```python\n" + PROMPT + HALF + "```"}],
        [{"role": "assistant", "content": "no code at all"}],
    ]
    out = f(prompts=chat, completions=comps, completion_ids=[[0]] * 3, task_id=["add"] * 3)
    assert out == pytest.approx([1.0, 1 / 3, -0.5])  # -0.5: the syntax error weight
    # Task from HumanEval columns; "auto" uses a str prompt that is Python as the code prefix.
    out = f(
        prompts=[PROMPT] * 2, completions=[GOOD, HALF], test=[TEST] * 2, entry_point=["add"] * 2
    )
    assert out == pytest.approx([1.0, 1 / 3])
    # A task column (JSON record) and stdin/stdout fields.
    io = json.dumps({"task_id": "io", "cases": [{"input": "3 4\n", "output": "7\n"}]})
    out = f(prompts=["sum"], completions=["print(sum(map(int, input().split())))"], task=[io])
    assert out == pytest.approx([1.0])
    with pytest.raises(ValueError, match="one value per completion"):
        f(prompts=["p"], completions=["x"], test=[TEST, TEST], entry_point=["add"])
    with pytest.raises(ValueError, match="prompt_source"):
        CodeReward(evaluator, prompt_source="bogus")


def test_code_reward_masks_and_logs(evaluator: Evaluator) -> None:
    metrics: dict[str, list[float]] = {}
    extra: dict[str, list[Any]] = {}
    f = AsyncCodeReward(evaluator, name="code")
    rows = {"task_id": ["add", "flaky"], "test": [TEST] * 2, "entry_point": ["add"] * 2}
    out = asyncio.run(
        f(
            prompts=[PROMPT] * 2,
            completions=[GOOD, GOOD],
            completion_ids=[[1], [2]],
            log_metric=lambda k, v: metrics.setdefault(k, []).append(v),
            log_extra=lambda k, v: extra.setdefault(k, []).extend(v),
            trainer_state=object(),
            **rows,
        )
    )
    assert out[0] == pytest.approx(1.0) and out[1] is None
    assert metrics == {"code/pass_rate": [1.0], "code/pass_fraction": [1.0], "code/masked": [0.5]}
    assert extra == {"code_error": ["passed", "sandbox_error"]}
    assert f.last[1].judgement.masked


# ---------------------------------------------------------------- TRL's GRPOTrainer


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory, evaluator: Evaluator) -> Any:
    trl = _quiet_import("trl")
    datasets = _quiet_import("datasets")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-gpt2")
    tok = char_tokenizer()
    cfg = GPT2Config(
        vocab_size=len(tok), n_positions=256, n_embd=32, n_layer=1, n_head=2,
        bos_token_id=1, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    ds = datasets.Dataset.from_list([{"prompt": PROMPT, **ROW}] * 4)
    sync_f, async_f = CodeReward(evaluator, name="code_sync"), AsyncCodeReward(evaluator)
    with warnings.catch_warnings():  # transformers/TRL deprecation notices
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(
            output_dir=str(d / "out"), max_steps=1, per_device_train_batch_size=4,
            num_generations=4, max_completion_length=8, report_to=[], use_cpu=True,
            logging_steps=1, save_strategy="no", bf16=False, seed=0,
        )  # fmt: skip
        trainer = trl.GRPOTrainer(
            model=str(d), reward_funcs=[sync_f, async_f], args=args, train_dataset=ds,
            processing_class=tok,
        )  # fmt: skip
    return trainer, sync_f, async_f


def test_trl_reward_path(grpo: Any) -> None:
    """TRL's own `_calculate_rewards` (what GRPOTrainer runs each step) with known
    completions: sync and async functions, chat completions, a masked row -> NaN."""
    trainer, _, _ = grpo
    assert trainer.reward_func_names == ["code_sync", "agentrl_code"]
    completions = [GOOD, HALF, FENCED, GOOD]
    inputs = [{"prompt": PROMPT, **ROW} for _ in completions]
    inputs[3]["task_id"] = "flaky-add"
    ids = [[1, 2]] * len(completions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rewards = trainer._calculate_rewards(inputs, [PROMPT] * 4, completions, ids)
    assert tuple(rewards.shape) == (4, 2)
    for col in range(2):
        got = rewards[:, col].tolist()
        assert got[:3] == pytest.approx([1.0, 1 / 3, 1.0]) and math.isnan(got[3])


def test_trl_one_training_step(grpo: Any) -> None:
    trainer, sync_f, async_f = grpo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert trainer.state.global_step == 1
    for f in (sync_f, async_f):
        assert len(f.last) == 4  # the four generations of the prompt, judged
        for s in f.last:  # an 8-token random completion never passes
            assert not s.judgement.masked and not s.judgement.passed
    logs = {k for entry in trainer.state.log_history for k in entry}
    assert {"rewards/code_sync/mean", "rewards/agentrl_code/mean"} <= logs
    assert {"code_sync/pass_rate", "agentrl_code/masked"} <= logs


# ---------------------------------------------------------------- verl's reward managers


@pytest.fixture(scope="module")
def verl_batch(evaluator: Evaluator) -> Iterator[Any]:
    _quiet_import("verl")
    np = pytest.importorskip("numpy")
    with warnings.catch_warnings():  # ray/verl deprecation notices at import time
        warnings.simplefilter("ignore")
        import verl.experimental.reward_loop.reward_manager.naive
        import verl.trainer.ppo.reward
        import verl.workers.reward_manager  # noqa: F401
        from verl import DataProto
    tok = char_tokenizer()
    responses = [GOOD, HALF, FENCED, GOOD]
    truths = [json.dumps({**ROW, "prompt": PROMPT})] * 3 + [
        {**ROW, "task_id": "flaky-add", "prompt": PROMPT}
    ]
    p_ids = tok("x", add_special_tokens=False).input_ids
    r_ids = [tok(r, add_special_tokens=False).input_ids for r in responses]
    width = max(map(len, r_ids)) + 2
    resp = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), len(p_ids) + width, dtype=torch.long)
    mask[:, : len(p_ids)] = 1
    for i, ids in enumerate(r_ids):
        resp[i, : len(ids)] = torch.tensor(ids)
        mask[i, len(p_ids) : len(p_ids) + len(ids)] = 1
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([p_ids] * len(responses)),
            "responses": resp,
            "attention_mask": mask,
        },
        non_tensors={
            "data_source": np.array(["agentrl/code"] * len(responses), dtype=object),
            "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
            "extra_info": np.array([{} for _ in responses], dtype=object),
        },
    )
    verl_adapter.configure(evaluator)
    try:
        yield tok, data, [len(x) for x in r_ids]
    finally:
        verl_adapter._close()


def _custom_fn(name: str, **reward_kwargs: Any) -> Any:
    """The function as verl loads it from `reward.custom_reward_function`."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": str(Path(verl_adapter.__file__)),
                    "name": name,
                    "reward_kwargs": reward_kwargs,
                }
            }
        }
    )
    return get_custom_reward_fn(cfg)


def test_verl_naive_manager(verl_batch: Any) -> None:
    from verl.workers.reward_manager.naive import NaiveRewardManager

    tok, data, lengths = verl_batch
    fn = _custom_fn("compute_score", masked_score=-7.0)
    out = NaiveRewardManager(tok, 0, compute_score=fn)(data, return_dict=True)
    t, info = out["reward_tensor"], out["reward_extra_info"]
    got = [t[i, n - 1].item() for i, n in enumerate(lengths)]
    assert got == pytest.approx([1.0, 1 / 3, 1.0, -7.0])
    assert float(t.sum()) == pytest.approx(sum(got))  # nothing written elsewhere
    assert info["acc"] == [1.0, 0.0, 1.0, 0.0] and info["masked"] == [0.0, 0.0, 0.0, 1.0]
    assert info["error_class"] == ["passed", "wrong_answer", "passed", "sandbox_error"]
    assert info["mask_reason"][:3] == ["", "", ""] and "sandbox" in info["mask_reason"][3]
    with pytest.raises(TypeError, match="unexpected reward_kwargs"):
        NaiveRewardManager(tok, 0, compute_score=_custom_fn("compute_score", bogus=1))(data)


def test_verl_batch_manager_and_raise(verl_batch: Any) -> None:
    from verl.workers.reward_manager.batch import BatchRewardManager

    tok, data, lengths = verl_batch
    mgr = BatchRewardManager(tok, 0, compute_score=_custom_fn("compute_score_batch"))
    t = mgr(data)
    got = [t[i, n - 1].item() for i, n in enumerate(lengths)]
    assert got == pytest.approx([1.0, 1 / 3, 1.0, 0.0])  # masked_score defaults to 0.0
    from agentrl.envs import RewardMasked

    with pytest.raises(RewardMasked, match="sandbox"):
        BatchRewardManager(tok, 0, compute_score=_custom_fn("compute_score_batch"), masked_score="raise")(data)  # fmt: skip


def test_verl_async_reward_loop(verl_batch: Any) -> None:
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager as LoopNaive

    tok, data, _ = verl_batch
    fn = _custom_fn("compute_score_async")

    async def main() -> list[dict[str, Any]]:
        mgr = LoopNaive(None, tok, fn)
        assert mgr.is_async_reward_score  # verl awaits it on its loop
        return list(await asyncio.gather(*(mgr.run_single(data[i : i + 1]) for i in range(4))))

    outs = asyncio.run(main())
    assert [o["reward_score"] for o in outs] == pytest.approx([1.0, 1 / 3, 1.0, 0.0])
    assert outs[3]["reward_extra_info"]["masked"] == 1.0


def test_code_reward_prompt_sources(evaluator: Evaluator) -> None:
    """Which code a completion continues: a one-word instruction is not code ("auto"), a
    `task_prompt` column is; "none" judges the completion alone."""
    body = [GOOD]
    cols = {"test": [TEST], "entry_point": ["add"]}
    auto = CodeReward(evaluator)
    assert auto(prompts=["add"], completions=[PROMPT + GOOD], **cols) == pytest.approx([1.0])
    assert auto(prompts=["add"], completions=body, task_prompt=[PROMPT], **cols) == [1.0]
    none = CodeReward(evaluator, prompt_source="none")
    assert none(prompts=[PROMPT], completions=body, **cols) == pytest.approx([-0.5])
    forced = CodeReward(evaluator, prompt_source="prompt")
    assert forced(prompts=[PROMPT], completions=body, **cols) == pytest.approx([1.0])
    with pytest.raises(TypeError, match="str prompts"):
        forced(prompts=[[{"role": "user", "content": "x"}]], completions=body, **cols)


_VERL_FORKED = """
import json, os, sys, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
from agentrl.integrations.verl import compute_score
truth = json.dumps({**ROW, "prompt": PROMPT})
assert compute_score("agentrl/code", GOOD, truth)["score"] == 1.0
pid = os.fork()
if pid == 0:  # a reward worker forked by the trainer after the first scores
    r = compute_score("agentrl/code", GOOD, truth)
    os._exit(0 if r["score"] == 1.0 else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert compute_score("agentrl/code", HALF, truth)["score"] < 1.0
"""


def test_verl_compute_score_in_a_forked_worker() -> None:
    setup = f"ROW = {ROW!r}\nPROMPT = {PROMPT!r}\nGOOD = {GOOD!r}\nHALF = {HALF!r}\n"
    r = subprocess.run(
        [sys.executable, "-c", setup + _VERL_FORKED], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
