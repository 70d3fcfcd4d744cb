"""Configuration of ``agentrl train``: :class:`TrainConfig`, settable from a TOML file and from
command-line flags generated from its fields (``--group-size 8``, ``--no-scale-std``).

Precedence: defaults < TOML file (``--config run.toml``; a flat table, or the keys under
``[train]``) < flags. Every field's docstring is its flag's help text.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["TrainConfig", "add_config_arguments", "config_from_args", "load_toml"]


@dataclass
class TrainConfig:
    """Everything ``agentrl train`` does: the built-in tasks, the model, the warm start, GRPO,
    evaluation and output. The defaults are the main job (a few minutes on 2 CPU cores)."""

    # ---- run
    out_dir: str | None = None
    """Output directory (metrics.jsonl, checkpoint/, plot.png, summary.json). None:
    ``runs/<timestamp>``."""
    seed: int = 0
    """Seeds the model init, the data, sampling and the task order."""
    threads: int = 2
    """torch intra-op threads for the warm start and evaluation."""
    rl_threads: int = 1
    """torch intra-op threads during RL, where sandboxes need the other cores."""
    progress: bool = True
    """Live progress view on the terminal (stderr)."""
    device: str | None = None
    """torch device (``cpu``, ``cuda``); None: CUDA when available, else CPU."""

    # ---- model
    n_layer: int = 2
    """Transformer blocks of the built-in TinyGPT."""
    n_head: int = 4
    """Attention heads per block."""
    d_model: int = 128
    """Width of the residual stream."""
    max_seq_len: int = 160
    """Longest prompt + completion, in bytes (the model is byte-level)."""

    # ---- tasks
    families: str | None = None
    """Comma-separated task families to use (arith, affine, compare, string, list); None:
    all."""
    held_out: float = 0.25
    """Share of each task family held out (never trained on) to measure the pass rate."""
    p_correct: float = 0.3
    """Probability that the weak programmer the warm start imitates writes a correct body
    (otherwise a plausible mistake)."""

    # ---- supervised warm start
    sft_steps: int = 400
    """Optimizer steps of the warm start (0: none)."""
    sft_batch_size: int = 64
    """Sequences per warm start step."""
    sft_lr: float = 3e-3
    """Peak learning rate of the warm start (linear warm-up, cosine decay)."""
    sft_warmup: int = 30
    """Warm-up steps of the warm start."""

    # ---- GRPO
    steps: int = 60
    """Policy updates (each bumps the policy version)."""
    group_size: int = 8
    """Completions sampled per task (one GRPO group)."""
    groups_per_step: int = 16
    """Groups per policy update (the batch is ``group_size * groups_per_step`` episodes)."""
    lr: float = 3e-4
    """AdamW learning rate of GRPO."""
    weight_decay: float = 0.0
    """AdamW weight decay of GRPO."""
    grad_clip: float = 1.0
    """Clip the gradient's global norm to this (0: no clipping)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward pass; gradients accumulate over the batch."""
    ppo_epochs: int = 1
    """Optimizer steps per batch (more than 1 makes the ratio clipping matter)."""
    temperature: float = 1.0
    """Sampling temperature of rollouts and of the held-out evaluation."""
    top_p: float = 1.0
    """Nucleus sampling threshold of rollouts (1: off)."""
    max_new_tokens: int = 16
    """Most tokens per completion (also the Dr. GRPO normaliser)."""
    loss_agg: str = "token_mean"
    """Loss aggregation: ``seq_mean``, ``token_mean`` (DAPO) or ``dr_grpo``."""
    scale_std: bool = False
    """Divide group-relative advantages by the group's std (GRPO) or not (Dr. GRPO)."""
    eps_low: float = 0.2
    """Lower clip range of the ratio."""
    eps_high: float = 0.28
    """Upper clip range of the ratio (DAPO's clip-higher)."""
    is_cap: float = 5.0
    """Cap of the importance weight ``pi_prox / pi_behav`` of stale tokens (0: uncapped)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the frozen warm-start policy (0: no reference)."""
    max_staleness: int = 1
    """Versions a rollout may lag the trainer (0: on-policy, generation waits for updates)."""
    partial_credit: bool = True
    """Reward = fraction of hidden tests passed (otherwise 1 if all pass, else 0)."""

    # ---- evaluation, output
    eval_every: int = 10
    """Evaluate the held-out pass rate every this many updates (0: only at start and end)."""
    eval_samples: int = 4
    """Samples per held-out task in periodic evaluations."""
    final_eval_samples: int = 8
    """Samples per held-out task in the first and the final evaluation."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many updates (0: only at the end)."""
    resume: str | None = None
    """Checkpoint directory to resume GRPO from (skips the warm start)."""
    sandbox_workers: int | None = None
    """Sandbox pool workers; None: the pool's default."""
    eval_timeout: float = 3.0
    """Per-test timeout of the evaluator, seconds."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            kind = _base_type(f.type)
            if v is None and _optional(f.type):
                continue
            if kind is bool and not isinstance(v, bool):
                raise TypeError(f"TrainConfig.{f.name} must be a bool, got {v!r}")
            if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise TypeError(f"TrainConfig.{f.name} must be an int, got {v!r}")
            if kind is float:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise TypeError(f"TrainConfig.{f.name} must be a number, got {v!r}")
                setattr(self, f.name, float(v))
            if kind is str and not isinstance(v, str):
                raise TypeError(f"TrainConfig.{f.name} must be a str, got {v!r}")
        positive = (
            "n_layer", "n_head", "d_model", "max_seq_len", "sft_batch_size", "steps",
            "group_size", "groups_per_step", "micro_batch_size", "ppo_epochs",
            "max_new_tokens", "eval_samples", "final_eval_samples", "threads", "rl_threads",
        )  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sft_steps", "sft_warmup", "eval_every", "checkpoint_every", "max_staleness"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("sft_lr", "lr", "eval_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TrainConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "grad_clip", "temperature", "eps_low", "eps_high"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.is_cap < 0 or self.kl_coef < 0:
            raise ValueError("TrainConfig.is_cap and kl_coef must be >= 0")
        if not 0.0 < self.held_out < 1.0:
            raise ValueError(f"TrainConfig.held_out must be in (0, 1), got {self.held_out}")
        if not 0.0 <= self.p_correct <= 1.0:
            raise ValueError(f"TrainConfig.p_correct must be in [0, 1], got {self.p_correct}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"TrainConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.loss_agg not in ("seq_mean", "token_mean", "dr_grpo"):
            raise ValueError(
                f"TrainConfig.loss_agg must be seq_mean, token_mean or dr_grpo, not {self.loss_agg!r}"
            )
        if self.d_model % self.n_head:
            raise ValueError("TrainConfig.n_head must divide d_model")
        if self.families is not None:
            from agentrl.train.tasks import FAMILIES

            names = [f.strip() for f in self.families.split(",") if f.strip()]
            bad = sorted(set(names) - set(FAMILIES))
            if not names or bad:
                raise ValueError(
                    f"TrainConfig.families: unknown {bad or self.families!r}; use {FAMILIES}"
                )
        if self.sandbox_workers is not None and self.sandbox_workers < 1:
            raise ValueError("TrainConfig.sandbox_workers must be >= 1 or None")

    @property
    def batch_episodes(self) -> int:
        """Episodes per policy update."""
        return self.group_size * self.groups_per_step

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON/TOML-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """A config from a dict of field values; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {', '.join(unknown)}")
        return cls(**d)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """A config from a TOML file (see :func:`load_toml`), then ``overrides``."""
        return cls.from_dict({**load_toml(path), **overrides})


def load_toml(path: str | Path) -> dict[str, Any]:
    """The config keys of a TOML file: its ``[train]`` table if it has one, else the top
    level. Dashes in keys are read as underscores."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    with open(path, "rb") as f:
        data = tomllib.load(f)
    table = data.get("train", data)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [train] must be a table")
    return {str(k).replace("-", "_"): v for k, v in table.items()}


# ---- flags generated from the fields


def _optional(annotation: Any) -> bool:
    return "None" in str(annotation)


def _base_type(annotation: Any) -> type:
    name = str(annotation).replace("| None", "").replace("None |", "").strip()
    return {"int": int, "float": float, "str": str, "bool": bool}[name]


@functools.cache
def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal after it in the class body)."""
    tree = ast.parse(inspect.getsource(TrainConfig))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    docs: dict[str, str] = {}
    body = cls.body
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _parse_value(kind: type, optional: bool, name: str) -> Any:
    def parse(text: str) -> Any:
        if optional and text.lower() in ("none", "null", ""):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--{name.replace('_', '-')}: expected {kind.__name__}, got {text!r}"
            ) from None

    return parse


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--config FILE`` and one flag per :class:`TrainConfig` field. Flags left out
    do not appear in the parsed namespace, so the TOML file and the defaults apply."""
    parser.add_argument("--config", metavar="FILE", help="TOML file of TrainConfig fields")
    docs = field_docs()
    group = parser.add_argument_group("training configuration (TrainConfig fields)")
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind, optional = _base_type(f.type), _optional(f.type)
        default = getattr(defaults, f.name)
        help_ = f"{docs.get(f.name, '')} (default: {default})".replace("%", "%%")
        if kind is bool:
            group.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_,
            )
        else:
            group.add_argument(
                flag,
                dest=f.name,
                type=_parse_value(kind, optional, f.name),
                default=argparse.SUPPRESS,
                metavar=kind.__name__.upper(),
                help=help_,
            )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The config of parsed flags: defaults, then ``--config``'s TOML, then the flags given."""
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values.update(load_toml(args.config))
    names = {f.name for f in fields(TrainConfig)}
    values.update({k: v for k, v in vars(args).items() if k in names})
    return TrainConfig.from_dict(values)
