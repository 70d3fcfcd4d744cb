"""Proves ``agentrl_reward.yaml`` works: loads it and builds the reward manager exactly as
verl's reward loop does (``verl.trainer.ppo.reward.load_reward_manager``, which reads
``reward.custom_reward_function`` and ``reward.reward_manager``), then scores a batch of
four responses (a ``DataProto``, as verl hands the reward workers) in agentrl's sandbox.

Run it (as root, or under ``agentrl rootless --``; needs verl 0.9 installed beside agentrl):

    python examples/verl/score_batch.py

It prints each response's score and error class, and the token-level reward tensor's sums::

    reward fn: compute_score_async from pkg://agentrl.integrations.verl (manager: naive)
    score +1.000  passed        masked 0.0  '    return a + b\\n'
    score +0.333  wrong_answer  masked 0.0  '    return a * b\\n'
    score +1.000  passed        masked 0.0  '```python\\ndef add(a, b):\\n    ...'
    score +1.000  passed        masked 0.0  'print(sum(map(int, input().split())))'
    rm_scores row sums: [1.0, 0.333, 1.0, 1.0]
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from verl import DataProto
from verl.trainer.ppo.reward import load_reward_manager

CONFIG = Path(__file__).with_name("agentrl_reward.yaml")
ADD = {  # a HumanEval-style task: the response continues `prompt`
    "prompt": 'def add(a, b):\n    """The sum of a and b."""\n',
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    "    assert candidate(0, 0) == 0\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}
SUM = {"cases": [{"input": "3 4\n", "output": "7\n"}, {"input": "-1 1\n", "output": "0\n"}]}
ROWS = [  # (response, the task: ground_truth as JSON text)
    ("    return a + b\n", ADD),
    ("    return a * b\n", ADD),  # passes one assert of three
    ("```python\ndef add(a, b):\n    return b + a\n```", ADD),  # the fence's code is judged
    ("print(sum(map(int, input().split())))", SUM),  # a stdin/stdout task
]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer (verl decodes the response ids with it)."""
    vocab = {"<pad>": 0, "<eos>": 1}
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def batch(tok: PreTrainedTokenizerFast) -> DataProto:
    """Right-padded responses after a one-token prompt, as verl's rollout produces them."""
    prompt = tok("x", add_special_tokens=False).input_ids
    ids = [tok(r, add_special_tokens=False).input_ids for r, _ in ROWS]
    width = max(map(len, ids))
    responses = torch.zeros(len(ROWS), width, dtype=torch.long)
    mask = torch.zeros(len(ROWS), len(prompt) + width, dtype=torch.long)
    mask[:, : len(prompt)] = 1
    for i, r in enumerate(ids):
        responses[i, : len(r)] = torch.tensor(r)
        mask[i, len(prompt) : len(prompt) + len(r)] = 1
    truths = [{"ground_truth": json.dumps(task)} for _, task in ROWS]
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([prompt] * len(ROWS)),
            "responses": responses,
            "attention_mask": mask,
        },
        non_tensors={
            "data_source": np.array(["agentrl/code"] * len(ROWS), dtype=object),
            "reward_model": np.array(truths, dtype=object),
            "extra_info": np.array([{} for _ in ROWS], dtype=object),
        },
    )


async def main() -> None:
    config = OmegaConf.load(CONFIG)  # in a real run: your whole verl config, this merged in
    fn = config.reward.custom_reward_function
    print(f"reward fn: {fn.name} from {fn.path} (manager: {config.reward.reward_manager.name})")
    tok = char_tokenizer()
    manager = load_reward_manager(config, tok)  # what each verl reward-loop worker does
    data = batch(tok)
    # verl's RewardLoopWorker.compute_score_batch: one run_single per row, concurrently.
    outs = await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(data))))
    for (response, _), out in zip(ROWS, outs, strict=True):
        info = out["reward_extra_info"]
        shown = response if len(response) < 40 else response[:28] + " ..."
        print(
            f"score {out['reward_score']:+.3f}  {info['error_class']:<13} "
            f"masked {info['masked']}  {shown!r}"
        )
    rm_scores = manager.assemble_rm_scores(data, [o["reward_score"] for o in outs])
    print(f"rm_scores row sums: {[round(x, 3) for x in rm_scores.sum(dim=1).tolist()]}")


if __name__ == "__main__":
    asyncio.run(main())
