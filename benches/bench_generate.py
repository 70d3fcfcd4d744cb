"""Generation and training-step speed of the built-in policy (issue 6).

Plain script; prints Markdown tables and writes them to ``benches/results_generate.md``::

    python benches/bench_generate.py                       # CUDA (bf16) if present, else CPU
    python benches/bench_generate.py --device cpu --threads 2 --new-tokens 64
    python benches/bench_generate.py --policy DIR          # a saved or Hugging Face model

Generation: tokens generated per second for batches of 1, 16 and 64 prompts, with the KV
cache and without it (every step recomputes the whole sequence), greedy decoding, the same
prompts and lengths for both. Training: one step = ``token_logprobs`` forward, backward and
AdamW on a batch of full-length sequences (the shape of a GRPO update).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from agentrl.policy import GPTConfig, Policy, SamplingParams

RESULTS = Path(__file__).with_name("results_generate.md")


def _sync(policy: Policy) -> None:
    if policy.device.type == "cuda":
        torch.cuda.synchronize(policy.device)


def _timed(policy: Policy, fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up (allocator, kernels, lazy init)
    times = []
    for _ in range(repeats):
        _sync(policy)
        t = time.perf_counter()
        fn()
        _sync(policy)
        times.append(time.perf_counter() - t)
    return times


def bench_generation(policy: Policy, batch: int, new_tokens: int, cached: bool, repeats: int):
    prompts = [f"def task_{i}(xs):\n    '''Return the sum of xs.'''\n" for i in range(batch)]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    counted: list[int] = []

    def go() -> None:
        gens = policy.generate(prompts, params, use_cache=cached)
        counted.append(sum(len(g.token_ids) for g in gens))

    times = _timed(policy, go, repeats)
    tokens = counted[-1]
    best = min(times)
    return tokens / best, statistics.median(times), tokens


def bench_train_step(policy: Policy, batch: int, seq: int, repeats: int) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    vocab = 256
    prompts = [torch.randint(0, vocab, (seq // 4,), generator=g).tolist() for _ in range(batch)]
    comps = [torch.randint(0, vocab, (seq - seq // 4,), generator=g).tolist() for _ in range(batch)]
    opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-4)
    policy.model.train()

    def step() -> None:
        lps = policy.token_logprobs(prompts, comps)
        loss = -torch.cat(lps).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = _timed(policy, step, repeats)
    policy.model.eval()
    return statistics.median(times), batch * seq / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    ap.add_argument("--dtype", default=None, help="float32 or bfloat16 (default by device)")
    ap.add_argument("--policy", default=None, help="saved policy or Hugging Face directory")
    ap.add_argument("--batches", default="1,16,64", help="generation batch sizes")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell (best is shown)")
    ap.add_argument("--no-recompute", action="store_true", help="skip the uncached runs")
    ap.add_argument("--train-batch", type=int, default=32, help="sequences per training step")
    ap.add_argument("--train-seq", type=int, default=256, help="tokens per training sequence")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.policy:
        policy = Policy.load(args.policy, device=args.device, dtype=args.dtype)
    else:
        policy = Policy.builtin(GPTConfig(), device=args.device, dtype=args.dtype, seed=0)
    n_params = sum(p.numel() for p in policy.model.parameters())
    dev = (
        torch.cuda.get_device_name(policy.device)
        if policy.device.type == "cuda"
        else (
            f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        )
    )
    head = [
        "## Policy speed",
        "",
        f"{type(policy.model).__name__}, {n_params / 1e6:.2f}M parameters, {policy.dtype}, "
        f"on {dev}; torch {torch.__version__}. Greedy decoding, {args.new_tokens} new tokens "
        f"per prompt; best of {args.repeats} runs.",
        "",
        "| batch | KV cache tok/s | recompute tok/s | speed-up | tokens |",
        "|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(head), flush=True)
    lines = list(head)
    for b in (int(x) for x in args.batches.split(",")):
        cached, _, tokens = bench_generation(policy, b, args.new_tokens, True, args.repeats)
        if args.no_recompute:
            plain_s, speedup = "-", "-"
        else:
            plain, _, _ = bench_generation(policy, b, args.new_tokens, False, args.repeats)
            plain_s, speedup = f"{plain:,.0f}", f"{cached / plain:.1f}x"
        row = f"| {b} | {cached:,.0f} | {plain_s} | {speedup} | {tokens} |"
        print(row, flush=True)
        lines.append(row)
    step_s, tps = bench_train_step(policy, args.train_batch, args.train_seq, args.repeats)
    train = [
        "",
        "| training step (forward + backward + AdamW) | time | tokens/s |",
        "|---|---:|---:|",
        f"| batch {args.train_batch} x {args.train_seq} tokens | {step_s * 1000:.1f} ms "
        f"| {tps:,.0f} |",
    ]
    print("\n".join(train), flush=True)
    lines += train
    if not args.no_write:
        RESULTS.write_text("\n".join(lines) + "\n")
        print(f"\nwritten to {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
