"""TRL's ``GRPOTrainer`` with agentrl's sandboxed code reward.

``agentrl.integrations.trl.AsyncCodeReward`` is a TRL reward function: TRL calls it with the
prompts, the completions and the data set's other columns, and it judges each completion in
the sandbox against the row's tests (HumanEval-style ``test`` + ``entry_point`` here; MBPP
``test_list``, stdin/stdout ``input_output``, a ``task`` column or a ``task_id`` also work).
The reward is the fraction of asserts passed, with a penalty for a syntax error; a sandbox
failure gives None (TRL leaves the row out), never a made-up 0.

So that it runs anywhere in seconds (no GPU, no model download), the model is a tiny
random-weight GPT-2 with a character-level tokenizer built on the spot; point ``model=`` at
a real checkpoint (a local directory or a hub name) and drop ``use_cpu=True`` to train one.

Run it (as root, or under ``agentrl rootless --``; needs ``pip install 'agentrl[trl]'``):

    python examples/trl_grpo.py

Besides TRL's own progress bars and log lines, it prints the reward of three known
completions (right, one assert of three passed, a syntax error), each training step's
reward metrics (a random model's 8-character completions never pass), and a summary::

    reward of known completions: [1.0, 0.333, -0.5]
    ...
    step 1: rewards/agentrl_code/mean=-0.375 agentrl_code/pass_rate=0 agentrl_code/masked=0
    step 2: rewards/agentrl_code/mean=-0.375 agentrl_code/pass_rate=0 agentrl_code/masked=0
    trained 2 steps; judged 4 completions in the last step
"""

from __future__ import annotations

import asyncio
import tempfile
import warnings

import torch
from agentrl import Evaluator
from agentrl.integrations.trl import AsyncCodeReward
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

PROMPT = 'def add(a, b):\n    """The sum of a and b."""\n'
TEST = (
    "def check(candidate):\n"
    "    assert candidate(1, 2) == 3\n"
    "    assert candidate(0, 0) == 0\n"
    "    assert candidate(-1, 1) == 0\n"
)


def tiny_model(directory: str) -> PreTrainedTokenizerFast:
    """Saves a random 1-layer GPT-2 and a character-level tokenizer in ``directory``."""
    vocab = {"<pad>": 0, "<eos>": 1}
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    config = GPT2Config(
        vocab_size=len(vocab), n_positions=256, n_embd=32, n_layer=1, n_head=2,
        bos_token_id=1, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return tokenizer


def main() -> None:
    torch.manual_seed(0)
    # One row per prompt; the reward function reads the tests from the row's columns.
    rows = [{"prompt": PROMPT, "test": TEST, "entry_point": "add"}] * 4
    with tempfile.TemporaryDirectory() as work, Evaluator(workers=4, timeout=3.0) as ev:
        reward = AsyncCodeReward(ev)  # name in TRL's logs: "agentrl_code"

        # The reward function alone, called as TRL calls it: a completion continues the
        # prompt (a correct body, a wrong one, and one that does not parse).
        known = ["    return a + b\n", "    return a * b\n", "    return (a +\n"]
        cols = {"test": [TEST] * 3, "entry_point": ["add"] * 3}
        scores = asyncio.run(reward(prompts=[PROMPT] * 3, completions=known, **cols))
        print(f"reward of known completions: {[round(s, 3) for s in scores]}")

        tokenizer = tiny_model(work)
        args = GRPOConfig(
            output_dir=f"{work}/out", max_steps=2, per_device_train_batch_size=4,
            num_generations=4, max_completion_length=8, report_to=[], use_cpu=True,
            logging_steps=1, save_strategy="no", bf16=False, seed=0,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=work, reward_funcs=[reward], args=args,
            train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        )  # fmt: skip
        trainer.train()

    for entry in trainer.state.log_history:
        if "step" in entry and any(k.startswith("rewards/") for k in entry):
            keys = ("rewards/agentrl_code/mean", "agentrl_code/pass_rate", "agentrl_code/masked")
            shown = " ".join(f"{k}={entry[k]:.3g}" for k in keys if k in entry)
            print(f"step {entry['step']}: {shown}")
    print(
        f"trained {trainer.state.global_step} steps; "
        f"judged {len(reward.last)} completions in the last step"
    )


if __name__ == "__main__":
    # transformers' deprecation notices (raised inside TRL's calls, not fixable here)
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    main()
