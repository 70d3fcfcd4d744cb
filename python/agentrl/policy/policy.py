"""The torch policy: batched generation with a KV cache, and log-probs for the trainer.

A :class:`Policy` wraps a causal LM (the built-in :class:`~agentrl.policy.gpt.TinyGPT` or a
Hugging Face model) with its tokenizer, device, dtype and a *version* (the number of
trainer updates its weights reflect). Both kinds of model go through the same code path
(:mod:`agentrl.policy.lm`).

Generation left-pads the prompts, runs one forward over them (prefill), then one token per
step with the cache. Sequences finish on their own (EOS, a stop string, their length limit);
finished sequences are dropped from the batch as it runs. The tokens of a completion keep
the EOS or the token that completed a stop string (the trainer learns to end), while the
text leaves both out.

Thread safety: :attr:`Policy.lock` is held by :meth:`generate` and :meth:`set_weights`; a
trainer that optimises :attr:`Policy.model` in place while another thread generates must
hold it around ``optimizer.step()``.
"""

from __future__ import annotations

import copy
import json
import secrets
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from agentrl.policy import lm
from agentrl.policy.gpt import GPTConfig, TinyGPT
from agentrl.policy.sampling import Generation, SamplingParams, StopMatcher, sample_next
from agentrl.policy.tokenizer import CharTokenizer, Tokenizer

__all__ = ["Policy", "default_device", "default_dtype"]

META_FILE = "agentrl_policy.json"
WEIGHTS_FILE = "model.pt"
_COMPACT_MIN_BATCH = 8
"""Finished rows are dropped from the running batch once it has at least this many rows
and half of them are done (smaller batches gain nothing from the copy)."""


def default_device(device: torch.device | str | None = None) -> torch.device:
    """``device`` as a torch.device; None means CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    return torch.device(device)


def default_dtype(device: torch.device, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """``dtype`` as a torch.dtype; None means bfloat16 on CUDA, float32 elsewhere."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        named = {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }
        if dtype not in named:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(named)}")
        return named[dtype]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype or its name, got {dtype!r}")
    return dtype


class Policy:
    """A causal LM with its tokenizer, ready to generate and to score completions."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        version: int = 0,
        eos_ids: Sequence[int] | None = None,
    ) -> None:
        self.device = default_device(device)
        self.dtype = default_dtype(self.device, dtype)
        self.model = model.to(device=self.device, dtype=self.dtype)
        self.tokenizer = tokenizer
        self.version = int(version)
        if eos_ids is None:
            eos_ids = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        """Ids that end a completion (finish reason ``"eos"``)."""
        self.lock = threading.RLock()
        """Held while generating and while weights change."""

    # ------------------------------------------------------------------ construction

    @classmethod
    def builtin(
        cls,
        config: GPTConfig | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        seed: int = 0,
    ) -> Policy:
        """A fresh built-in :class:`TinyGPT` (initialised from ``seed``) with the byte-level
        :class:`CharTokenizer`."""
        config = config or GPTConfig()
        tok = CharTokenizer()
        if config.vocab_size < tok.vocab_size:
            raise ValueError(
                f"GPTConfig.vocab_size={config.vocab_size} is smaller than the "
                f"CharTokenizer's {tok.vocab_size}"
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = TinyGPT(config)
        return cls(model, tok, device=device, dtype=dtype)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
    ) -> Policy:
        """A Hugging Face causal LM and its tokenizer from the local directory ``path``
        (never downloads)."""
        from agentrl.policy.hf import load_hf

        dev = default_device(device)
        dt = default_dtype(dev, dtype)
        model, tok, eos_ids = load_hf(path, dtype=dt)
        policy = cls(model, tok, device=dev, dtype=dt, eos_ids=eos_ids)
        meta = Path(path) / META_FILE
        if meta.is_file():
            policy.version = int(json.loads(meta.read_text()).get("version", 0))
        return policy

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
    ) -> Policy:
        """A policy saved by :meth:`save` (built-in or Hugging Face), or any Hugging Face
        model directory."""
        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"Policy.load: {str(path)!r} is not a directory")
        meta_file = path / META_FILE
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {"kind": "hf"}
        if meta.get("kind") == "builtin":
            config = GPTConfig.from_dict(meta["config"])
            policy = cls(TinyGPT(config), CharTokenizer(), device=device, dtype=dtype)
            sd = torch.load(path / WEIGHTS_FILE, map_location=policy.device, weights_only=True)
            policy.model.load_state_dict(sd)
            policy.version = int(meta.get("version", 0))
            return policy
        if meta.get("kind") == "hf":
            return cls.from_pretrained(path, device=device, dtype=dtype)
        raise ValueError(f"Policy.load: unknown policy kind {meta.get('kind')!r} in {meta_file}")

    def save(self, path: str | Path) -> None:
        """Writes the weights, the configuration and the version under directory ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with self.lock:
            if isinstance(self.model, TinyGPT):
                torch.save(self.model.state_dict(), path / WEIGHTS_FILE)
                meta: dict[str, Any] = {
                    "kind": "builtin",
                    "config": self.model.config.to_dict(),
                    "tokenizer": "char",
                }
            else:
                self.model.save_pretrained(path)  # type: ignore[operator]
                self.tokenizer.save_pretrained(path)  # type: ignore[attr-defined]
                meta = {"kind": "hf"}
            meta["version"] = self.version
            (path / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    def copy(self) -> Policy:
        """An independent copy (same device, dtype, version), e.g. a reference policy."""
        with self.lock:
            model = copy.deepcopy(self.model)
        return Policy(
            model,
            self.tokenizer,
            device=self.device,
            dtype=self.dtype,
            version=self.version,
            eos_ids=sorted(self.eos_ids),
        )

    # ------------------------------------------------------------------ weights

    def state_dict(self) -> dict[str, Tensor]:
        """The model's state dict."""
        return self.model.state_dict()

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Loads weights (cast to this policy's device and dtype); the version stays."""
        with self.lock:
            self.model.load_state_dict(state_dict)

    def set_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Loads new weights and sets the version, atomically with respect to generation."""
        if not isinstance(version, int):
            raise TypeError(f"set_weights: version must be an int, got {version!r}")
        with self.lock:
            self.model.load_state_dict(state_dict)
            self.version = version

    # ------------------------------------------------------------------ scoring

    def token_logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
    ) -> list[Tensor]:
        """Per-token log-probs (float32, 1-D) of each completion given its prompt, under the
        current weights at ``temperature`` (``log_softmax(logits / temperature)``).

        One batched, right-padded forward; differentiable when grad is enabled. Does not
        take :attr:`lock`.
        """
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(
                f"token_logprobs: {len(prompt_ids)} prompts but {len(completion_ids)} completions"
            )
        if not temperature > 0:
            raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature!r}")
        if not prompt_ids:
            return []
        seqs = []
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
            if len(p) == 0:
                raise ValueError(f"token_logprobs: prompt {i} is empty (nothing predicts token 0)")
            seqs.append([*p, *c])
        longest = max(len(s) for s in seqs)
        limit = lm.context_length(self.model)
        if limit is not None and longest > limit:
            raise ValueError(
                f"token_logprobs: a sequence of {longest} tokens exceeds the context of {limit}"
            )
        pad = self.tokenizer.pad_id
        ids = torch.full((len(seqs), longest), pad, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        ids = ids.to(self.device)
        # right padding: causal attention alone keeps real tokens off the padding; the
        # built-in model then takes its fast path, a Hugging Face model gets the explicit mask
        mask = None
        if not isinstance(self.model, TinyGPT):
            mask = torch.zeros((len(seqs), longest), dtype=torch.long)
            for i, s in enumerate(seqs):
                mask[i, : len(s)] = 1
            mask = mask.to(self.device)
        logits, _ = lm.forward(self.model, ids, mask, None)
        rows, cols, targets, counts = [], [], [], []
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
            n = len(c)
            rows += [i] * n
            cols += range(len(p) - 1, len(p) - 1 + n)
            targets += c
            counts.append(n)
        dev = self.device
        picked = logits[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)].float()
        logp = torch.log_softmax(picked / temperature, dim=-1)
        out = logp.gather(1, torch.tensor(targets, device=dev, dtype=torch.long)[:, None])
        return list(out.squeeze(1).split(counts))

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompts: Sequence[str],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_cache: bool = True,
    ) -> list[Generation]:
        """Completes each prompt; see the module docstring.

        ``params`` is one :class:`SamplingParams` for all prompts or one per prompt (all rows
        then share one random generator, seeded by the first row's ``seed``). With
        ``use_cache=False`` every step recomputes the whole sequence (a reference for tests
        and benchmarks).
        """
        if isinstance(prompts, str):
            raise TypeError("generate: prompts must be a sequence of str, not one str")
        for p in prompts:
            if not isinstance(p, str):
                raise TypeError(f"generate: prompts must be str, got {type(p).__name__}")
        per_row = self._per_row_params(params, len(prompts))
        prompt_ids = [self.tokenizer.encode_prompt(p) for p in prompts]
        return self.generate_ids(prompt_ids, per_row, prompts=prompts, use_cache=use_cache)

    @staticmethod
    def _per_row_params(
        params: SamplingParams | Sequence[SamplingParams] | None, n: int
    ) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * n
        if isinstance(params, SamplingParams):
            return [params] * n
        rows = list(params)
        if len(rows) != n:
            raise ValueError(f"generate: {n} prompts but {len(rows)} SamplingParams")
        for r in rows:
            if not isinstance(r, SamplingParams):
                raise TypeError(f"generate: params must be SamplingParams, got {type(r).__name__}")
        return rows

    @torch.no_grad()
    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompts: Sequence[str] | None = None,
        use_cache: bool = True,
        on_token: Callable[[int, int, float], None] | None = None,
    ) -> list[Generation]:
        """As :meth:`generate`, from token ids (``prompts`` only fills ``Generation.prompt``).

        ``on_token(row, token_id, logprob)``, when given, is called (in the generating thread)
        for each token as it is sampled, in order per row: the streaming hook of
        ``agentrl serve``. It must be quick and must not raise.
        """
        rows = self._per_row_params(params, len(prompt_ids))
        if not rows:
            return []
        with self.lock:
            was_training = self.model.training
            self.model.eval()
            try:
                return self._generate(prompt_ids, rows, prompts, use_cache, on_token)
            finally:
                self.model.train(was_training)

    def _generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        rows: list[SamplingParams],
        prompts: Sequence[str] | None,
        use_cache: bool,
        on_token: Callable[[int, int, float], None] | None = None,
    ) -> list[Generation]:
        tok, dev, n = self.tokenizer, self.device, len(prompt_ids)
        ctx = lm.context_length(self.model)
        limits = []
        for i, (p, r) in enumerate(zip(prompt_ids, rows, strict=True)):
            if len(p) == 0:
                raise ValueError(f"generate: prompt {i} has no tokens")
            room = r.max_new_tokens if ctx is None else min(r.max_new_tokens, ctx - len(p))
            if room < 1:
                raise ValueError(
                    f"generate: prompt {i} has {len(p)} tokens, no room left in the "
                    f"model's context of {ctx}"
                )
            limits.append(room)
        version = self.version
        seed = rows[0].seed if rows[0].seed is not None else secrets.randbits(63)
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        temps = torch.tensor([float(r.temperature) for r in rows], device=dev)
        top_ps = torch.tensor([float(r.top_p) for r in rows], device=dev)
        all_greedy = all(r.temperature == 0 for r in rows)
        use_top_p = any(r.top_p < 1.0 and r.temperature > 0 for r in rows)
        matchers = [StopMatcher(r.stop) for r in rows]

        width = max(len(p) for p in prompt_ids)
        ids = torch.full((n, width), tok.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        cache = lm.new_cache(self.model, n, width + max(limits)) if use_cache else None
        logits, cache = lm.forward(
            self.model, ids, mask, pos, cache, use_cache=use_cache, last_only=True
        )
        logits = logits[:, -1]
        next_pos = pos[:, -1] + 1

        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lp: list[list[float]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        stops: list[tuple[int, str] | None] = [None] * n
        checked = [0] * n
        batch = list(range(n))  # original index of each row of the running batch
        active = [True] * n  # finished rows stay in the batch (fed padding) until compaction
        full_ids, full_mask, full_pos = ids, mask, pos  # the uncached path re-feeds these
        while True:
            tokens, lps = sample_next(
                logits, temps, top_ps, gen, all_greedy=all_greedy, use_top_p=use_top_p
            )
            tok_list, lp_list = tokens.tolist(), lps.tolist()
            for row, i in enumerate(batch):
                if not active[row]:
                    continue
                tid = tok_list[row]
                out_ids[i].append(tid)
                out_lp[i].append(lp_list[row])
                if on_token is not None:
                    on_token(i, tid, lp_list[row])
                if tid in self.eos_ids:
                    finish[i] = "eos"
                elif matchers[i].stops:
                    text = tok.decode(out_ids[i])
                    stops[i] = matchers[i].find(text, max(0, checked[i] - 4))
                    checked[i] = len(text)
                    if stops[i] is not None:
                        finish[i] = "stop"
                if finish[i] is None and len(out_ids[i]) >= limits[i]:
                    finish[i] = "length"
                active[row] = finish[i] is None
            n_active = sum(active)
            if n_active == 0:
                break
            alive = torch.tensor(active, device=dev)
            step_ids = torch.where(alive, tokens, tok.pad_id)[:, None]
            step_mask = alive.long()[:, None]
            step_pos = torch.where(alive, next_pos, 0)[:, None]
            next_pos = next_pos + 1
            if use_cache:
                mask = torch.cat([mask, step_mask], 1)
                logits, cache = lm.forward(
                    self.model, step_ids, mask, step_pos, cache, use_cache=True
                )
            else:
                full_ids = torch.cat([full_ids, step_ids], 1)
                full_mask = torch.cat([full_mask, step_mask], 1)
                full_pos = torch.cat([full_pos, step_pos], 1)
                logits, _ = lm.forward(self.model, full_ids, full_mask, full_pos)
            logits = logits[:, -1]
            if len(batch) >= _COMPACT_MIN_BATCH and 2 * n_active <= len(batch):
                keep_rows = [r for r in range(len(batch)) if active[r]]
                keep = torch.tensor(keep_rows, device=dev)
                batch = [batch[r] for r in keep_rows]
                active = [True] * len(batch)
                logits, next_pos, temps, top_ps = (
                    logits[keep],
                    next_pos[keep],
                    temps[keep],
                    top_ps[keep],
                )
                if use_cache:
                    mask = mask[keep]
                    cache = lm.select_rows(cache, keep)
                else:
                    full_ids, full_mask, full_pos = full_ids[keep], full_mask[keep], full_pos[keep]
        return self._results(prompt_ids, prompts, out_ids, out_lp, finish, stops, version)

    def _results(
        self,
        prompt_ids: Sequence[Sequence[int]],
        prompts: Sequence[str] | None,
        out_ids: list[list[int]],
        out_lp: list[list[float]],
        finish: list[str | None],
        stops: list[tuple[int, str] | None],
        version: int,
    ) -> list[Generation]:
        results = []
        for i, p in enumerate(prompt_ids):
            text = self.tokenizer.decode(out_ids[i])
            hit = stops[i]
            if hit is not None:
                text = text[: hit[0]]
            results.append(
                Generation(
                    prompt=prompts[i] if prompts is not None else self.tokenizer.decode(p),
                    text=text,
                    prompt_ids=list(p),
                    token_ids=out_ids[i],
                    logprobs=out_lp[i],
                    finish_reason=finish[i] or "length",
                    version=version,
                    stop=hit[1] if hit is not None else None,
                )
            )
        return results

    def __repr__(self) -> str:
        kind = type(self.model).__name__
        n = sum(p.numel() for p in self.model.parameters())
        return (
            f"Policy({kind}, {n / 1e6:.2f}M params, device={self.device}, "
            f"dtype={self.dtype}, version={self.version})"
        )
