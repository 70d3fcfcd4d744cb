"""Configuration of ``agentrl train``: :class:`TrainConfig`, composed of its parts, settable
from a TOML file and from command-line flags generated from the fields.

Every setting is declared once, with its docstring (its flag's help), in one of:

* :class:`TrainConfig`: the run, the model, the tasks, the RL loop, evaluation and output;
* :class:`GRPOConfig` (``TrainConfig.grpo``): the trainer's hyper-parameters
  (:class:`~agentrl.train.trainer.GRPOTrainer`; the defaults of
  :func:`~agentrl.train.grpo.policy_loss` are these);
* :class:`SFTConfig` (``TrainConfig.sft``): the supervised warm start
  (:func:`~agentrl.train.sft.supervised_warm_start`).

Names (see :func:`settings`): a field of TrainConfig itself is ``--NAME`` (``--group-size``)
and the TOML key ``NAME`` under ``[train]`` or at the top level of the file. A field of a
part is ``--PART-NAME`` (``--sft-lr``, ``--grpo-eps-high``) and the key ``NAME`` under
``[PART]`` or the flat key ``PART_NAME``; where no other field of the whole config has its
name it is also ``--NAME`` and the flat key ``NAME`` (``--eps-high``, ``--batch-size``).
``lr``, ``weight_decay`` and ``grad_clip`` are in both parts: only prefixed
(``--grpo-lr``, ``--sft-lr``); the bare ``--lr`` is refused as ambiguous. Dashes in TOML
keys read as underscores. An unknown key or flag is an error naming it.

Precedence: defaults < TOML file (``--config run.toml``) < flags. ``agentrl train
--print-config`` writes the config as TOML that ``--config`` reads back to the same config;
a key left out of a file (as unset ones, None, are) takes its default.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import difflib
import functools
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from agentrl.train._fields import Kind, check, check_types, field_docs, from_dict, kinds, toml_value

__all__ = [
    "AGGREGATIONS",
    "GRPOConfig",
    "SFTConfig",
    "Setting",
    "TrainConfig",
    "add_config_arguments",
    "config_from_args",
    "field_docs",
    "load_toml",
    "settings",
    "to_toml",
]

AGGREGATIONS = ("seq_mean", "token_mean", "dr_grpo")
"""The loss aggregations of :func:`agentrl.train.grpo.aggregate`."""


@dataclass
class GRPOConfig:
    """Hyper-parameters of :class:`~agentrl.train.trainer.GRPOTrainer` (``[grpo]`` of
    ``agentrl train``)."""

    lr: float = 3e-4
    """AdamW learning rate of GRPO."""
    weight_decay: float = 0.0
    """AdamW weight decay of GRPO."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas of GRPO."""
    grad_clip: float = 1.0
    """Clip GRPO's gradient global norm to this (0: no clipping)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward pass; gradients accumulate over the batch."""
    ppo_epochs: int = 1
    """Optimizer steps per batch. With 1 the ratio is 1 and only the importance weights of
    stale tokens matter; with more, the ratio is clipped around the proximal policy."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts (log-probs are recomputed at it); ``agentrl
    train`` samples its held-out evaluations at it too."""
    max_new_tokens: int = 16
    """Most tokens per completion ``agentrl train`` samples; also the Dr. GRPO normaliser."""
    loss_agg: str = "token_mean"
    """Loss aggregation: ``seq_mean`` (GRPO), ``token_mean`` (DAPO) or ``dr_grpo``."""
    scale_std: bool = False
    """Divide group-relative advantages by the group's std (GRPO) or not (Dr. GRPO)."""
    eps_low: float = 0.2
    """Lower clip range of the ratio."""
    eps_high: float = 0.28
    """Upper clip range of the ratio (DAPO's clip-higher)."""
    is_cap: float = 5.0
    """Cap of the importance weight ``pi_prox / pi_behav`` of stale tokens (0: uncapped)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the reference (the frozen warm-start policy; 0: no
    reference)."""

    def __post_init__(self) -> None:
        check_types(self)
        check(self, lambda v: v > 0, "> 0", "lr", "temperature")
        check(self, lambda v: v >= 1, ">= 1", "micro_batch_size", "ppo_epochs", "max_new_tokens")
        check(self, lambda v: v >= 0, ">= 0", "weight_decay", "grad_clip", "eps_low",
               "eps_high", "is_cap", "kl_coef")  # fmt: skip
        check(self, lambda v: v in AGGREGATIONS, f"one of {AGGREGATIONS}", "loss_agg")


@dataclass
class SFTConfig:
    """Hyper-parameters of :func:`~agentrl.train.sft.supervised_warm_start` (``[sft]`` of
    ``agentrl train``)."""

    steps: int = 400
    """Optimizer steps of the warm start (0: none)."""
    batch_size: int = 64
    """(prompt, completion) pairs per warm-start step."""
    lr: float = 3e-3
    """Peak learning rate of the warm start (linear warm-up, then cosine decay to 0)."""
    warmup: int = 30
    """Linear warm-up steps of the warm start."""
    weight_decay: float = 0.0
    """AdamW weight decay of the warm start."""
    grad_clip: float = 1.0
    """Clip the warm start's gradient global norm to this (0: no clipping)."""
    seed: int | None = None
    """Seeds the order of the pairs. None: ``agentrl train`` uses its ``seed``, a direct
    call of ``supervised_warm_start`` 0."""

    def __post_init__(self) -> None:
        check_types(self)
        check(self, lambda v: v >= 0, ">= 0", "steps", "warmup", "weight_decay", "grad_clip")
        check(self, lambda v: v >= 1, ">= 1", "batch_size")
        check(self, lambda v: v > 0, "> 0", "lr")


@dataclass
class TrainConfig:
    """Everything ``agentrl train`` does: the built-in tasks, the model, the warm start
    (:attr:`sft`), GRPO (:attr:`grpo` and the RL loop), evaluation and output. The
    defaults are the main job (a few minutes on 2 CPU cores)."""

    # ---- run
    out_dir: str | None = None
    """Output directory (metrics.jsonl, checkpoint/, plot.png, summary.json). None:
    ``runs/<timestamp>``."""
    seed: int = 0
    """Seeds the model init, the data, sampling, the task order and (unless the warm start
    has a seed of its own) the warm start."""
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

    # ---- the RL loop
    steps: int = 60
    """Policy updates (each bumps the policy version)."""
    group_size: int = 8
    """Completions sampled per task (one GRPO group)."""
    groups_per_step: int = 16
    """Groups per policy update (the batch is ``group_size * groups_per_step`` episodes)."""
    top_p: float = 1.0
    """Nucleus sampling threshold of rollouts (1: off)."""
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
    report_to: str = "jsonl"
    """Where the run's metrics go, comma-separated (as TRL's ``report_to``): ``jsonl``
    (``metrics.jsonl``), ``tensorboard`` (event files under ``tensorboard/``), ``wandb``
    (Weights & Biases; ``WANDB_MODE=offline`` keeps it local), or ``none``."""
    metrics_port: int | None = None
    """Serve Prometheus metrics (sandbox pool, scheduler, trainer) at
    ``http://127.0.0.1:PORT/metrics`` during the run; 0: a free port (printed). None: off."""
    traces: str = "jsonl"
    """Record a trace of every sandbox run and judgement under ``traces/`` of the output
    directory (``agentrl traces search --traces DIR``): ``jsonl``, ``sqlite`` (full-text
    search) or ``none``."""
    ray_address: str | None = None
    """Run the rewards on this Ray cluster (``agentrl.distributed.RayPool``, one sandbox actor
    per node; ``auto``: the running one); None: a local pool."""

    # ---- the parts
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPO: the trainer's hyper-parameters."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The supervised warm start."""

    def __post_init__(self) -> None:
        check_types(self)
        check(self, lambda v: v >= 1, ">= 1", "n_layer", "n_head", "d_model", "max_seq_len",
               "steps", "group_size", "groups_per_step", "eval_samples", "final_eval_samples",
               "threads", "rl_threads", "sandbox_workers")  # fmt: skip
        check(self, lambda v: v >= 0, ">= 0", "eval_every", "checkpoint_every", "max_staleness")
        check(self, lambda v: v > 0, "> 0", "eval_timeout")
        check(self, lambda v: 0.0 < v < 1.0, "in (0, 1)", "held_out")
        check(self, lambda v: 0.0 <= v <= 1.0, "in [0, 1]", "p_correct")
        check(self, lambda v: 0.0 < v <= 1.0, "in (0, 1]", "top_p")
        if self.d_model % self.n_head:
            raise ValueError("TrainConfig.n_head must divide d_model")
        from agentrl.observability.report import check_report_to

        check_report_to(self.report_to)
        if self.traces not in ("jsonl", "sqlite", "none"):
            raise ValueError(
                f'TrainConfig.traces must be "jsonl", "sqlite" or "none", got {self.traces!r}'
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(
                f"TrainConfig.metrics_port must be in [0, 65535], got {self.metrics_port}"
            )
        if self.families is not None:
            from agentrl.train.families import FAMILIES

            names = [f.strip() for f in self.families.split(",") if f.strip()]
            bad = sorted(set(names) - set(FAMILIES))
            if not names or bad:
                raise ValueError(
                    f"TrainConfig.families: unknown {bad or self.families!r}; use {FAMILIES}"
                )

    @property
    def batch_episodes(self) -> int:
        """Episodes per policy update."""
        return self.group_size * self.groups_per_step

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (the parts as nested dicts)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """A config from a dict of field values, the parts as nested dicts (what
        :meth:`to_dict` returns; a part's keys left out take their defaults); unknown keys
        are an error."""
        return from_dict(cls, d)

    def to_toml(self) -> str:
        """The config as TOML (see :func:`to_toml`)."""
        return to_toml(self)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """A config from a TOML file (see :func:`load_toml`), then ``overrides`` (by the
        flat keys: ``steps=3``, ``eps_high=0.3``, ``sft_lr=1e-3``)."""
        values = load_toml(path)
        for key, v in overrides.items():
            _put(values, _resolve(key, key, "overrides"), v)
        return cls.from_dict(values)


# ---- the settings and their names


class Setting(NamedTuple):
    """One setting: a field of :class:`TrainConfig` or of one of its parts."""

    part: str | None
    """The TrainConfig field holding the part (``grpo``, ``sft``); None: TrainConfig's own."""
    name: str
    """The field's name in its class."""
    cls: type
    """The class declaring it."""
    keys: tuple[str, ...]
    """Its flat names (TOML keys; flags with ``-`` for ``_``), the canonical one first."""

    @property
    def path(self) -> str:
        """``name`` or ``part.name``."""
        return self.name if self.part is None else f"{self.part}.{self.name}"

    @property
    def flags(self) -> list[str]:
        """Its flags (``--grpo-eps-high``, ``--eps-high``), the canonical one first."""
        return ["--" + k.replace("_", "-") for k in self.keys]


def _parts() -> dict[str, type]:
    return {n: k.base for n, k in kinds(TrainConfig).items() if dataclasses.is_dataclass(k.base)}


@functools.cache
def settings() -> tuple[Setting, ...]:
    """Every setting, TrainConfig's own first, then each part's, with its generated names
    (see the module docs). The names are checked to be unique."""
    parts = _parts()
    own = [f.name for f in fields(TrainConfig) if f.name not in parts]
    count = collections.Counter(own + [f.name for p in parts.values() for f in fields(p)])
    out = [Setting(None, n, TrainConfig, (n,)) for n in own]
    for pname, pcls in parts.items():
        for f in fields(pcls):
            bare = (f.name,) if count[f.name] == 1 else ()
            out.append(Setting(pname, f.name, pcls, (f"{pname}_{f.name}", *bare)))
    seen: dict[str, str] = {}
    for s in out:
        for k in s.keys:
            if k in seen or k in parts:
                raise AssertionError(f"config key {k!r} of {s.path} is also {seen.get(k, k)}")
            seen[k] = s.path
    return tuple(out)


@functools.cache
def _by_key() -> dict[str, Setting]:
    return {k: s for s in settings() for k in s.keys}


@functools.cache
def _ambiguous() -> dict[str, list[Setting]]:
    """Bare names that are in more than one part (and not TrainConfig's own)."""
    out: dict[str, list[Setting]] = collections.defaultdict(list)
    for s in settings():
        if s.part is not None and s.name not in _by_key():
            out[s.name].append(s)
    return dict(out)


def _resolve(key: str, shown: str, src: str) -> Setting:
    key = key.replace("-", "_")
    s = _by_key().get(key)
    if s is not None:
        return s
    if key in _ambiguous():
        use = " or ".join(f"[{a.part}] {a.name} ({a.keys[0]})" for a in _ambiguous()[key])
        raise ValueError(f"{src}: key {shown!r} is ambiguous: use {use}")
    near = difflib.get_close_matches(key, [*_by_key(), *_parts()], n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ValueError(f"{src}: unknown key {shown!r}{hint}")


def _put(values: dict[str, Any], s: Setting, v: Any) -> None:
    (values if s.part is None else values.setdefault(s.part, {}))[s.name] = v


# ---- TOML


def load_toml(path: str | Path) -> dict[str, Any]:
    """The settings of a TOML file, as :meth:`TrainConfig.from_dict` takes them: tables
    ``[train]`` (TrainConfig's own fields), ``[grpo]`` and ``[sft]`` (the parts' fields),
    and flat keys (at the top level or under ``[train]``: any name of :func:`settings`).
    An unknown or ambiguous key, or a setting given twice, is an error naming it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    with open(path, "rb") as f:
        data = tomllib.load(f)
    src, parts = str(path), _parts()
    values: dict[str, Any] = {}
    where: dict[str, str] = {}

    def put(s: Setting, v: Any, at: str) -> None:
        if s.path in where:
            raise ValueError(f"{src}: {s.path} is set twice ({where[s.path]} and {at})")
        where[s.path] = at
        _put(values, s, v)

    for key, v in data.items():
        table = key.replace("-", "_")
        if table == "train" and isinstance(v, dict):
            for k, x in v.items():
                put(_resolve(k, f"[train] {k}", src), x, f"[train] {k}")
        elif table in parts and isinstance(v, dict):
            names = {s.name: s for s in settings() if s.part == table}
            for k, x in v.items():
                s = names.get(k.replace("-", "_"))
                if s is None:
                    near = difflib.get_close_matches(k.replace("-", "_"), names, n=1)
                    hint = f" (did you mean {near[0]!r}?)" if near else ""
                    raise ValueError(f"{src}: unknown key {k!r} in [{table}]{hint}")
                put(s, x, f"[{table}] {k}")
        elif isinstance(v, dict):
            raise ValueError(f"{src}: unknown table [{key}] (use [train], [grpo], [sft])")
        else:
            put(_resolve(key, key, src), v, key)
    return values


def to_toml(config: TrainConfig) -> str:
    """``config`` as TOML: ``[train]``, ``[grpo]`` and ``[sft]``, every field with its
    docstring as a comment. Unset fields (None) are left out, as comments: a key left out
    takes its default, and None is each such field's default. :func:`load_toml` reads it
    back to an equal config."""
    lines = [
        "# agentrl train configuration; `agentrl train --config FILE` reads it.",
        "# A key left out takes its default (None, unset, for the commented-out ones).",
    ]
    for table, part in [("train", None), *((p, p) for p in _parts())]:
        obj = config if part is None else getattr(config, part)
        lines += ["", f"[{table}]"]
        for s in settings():
            if s.part != part:
                continue
            doc = field_docs(s.cls).get(s.name, "")
            lines += ["# " + ln for ln in textwrap.wrap(doc, 94)]
            v = getattr(obj, s.name)
            lines.append(f"# {s.name} = (unset)" if v is None else f"{s.name} = {toml_value(v)}")
    return "\n".join(lines) + "\n"


# ---- flags


def _parse_value(kind: Kind, flag: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if kind.optional and text.lower() in ("none", "null", ""):
            return None
        try:
            return kind.base(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag}: expected {kind.base.__name__}, got {text!r}"
            ) from None

    return parse


class _Ambiguous(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, use: str = "", **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, **kw)
        self.use = use

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        parser.error(f"{self.option_strings[0]} is ambiguous: use {self.use}")


def _shown(v: Any) -> str:
    return " ".join(map(str, v)) if isinstance(v, tuple) else str(v)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--config FILE`` and the flags of :func:`settings`, one group per part. Flags
    left out do not appear in the parsed namespace, so the TOML file and the defaults
    apply; each flag's ``dest`` is its canonical key."""
    parser.add_argument(
        "--config", metavar="FILE", help="TOML file of settings (see --print-config)"
    )
    defaults = TrainConfig()
    groups: dict[str | None, Any] = {
        None: parser.add_argument_group("run, model, tasks, RL loop ([train] in TOML)")
    }
    for part, cls in _parts().items():
        doc = field_docs(TrainConfig)[part].rstrip(".")
        groups[part] = parser.add_argument_group(f"{doc} ([{part}] in TOML, {cls.__name__})")
    by_name = collections.defaultdict(list)
    for s in settings():
        by_name[s.name].append(s)
    for s in settings():
        kind = kinds(s.cls)[s.name]
        default = getattr(defaults if s.part is None else getattr(defaults, s.part), s.name)
        notes = [] if default is None else [f"default: {_shown(default)}"]
        notes += [
            f"also [{o.part or 'train'}] {o.name}: {o.flags[0]}"
            for o in by_name[s.name]
            if o is not s
        ]
        help_ = field_docs(s.cls).get(s.name, "") + (f" ({'; '.join(notes)})" if notes else "")
        kw: dict[str, Any] = {"dest": s.keys[0], "default": argparse.SUPPRESS}
        kw["help"] = help_.replace("%", "%%")
        if kind.base is bool:
            groups[s.part].add_argument(*s.flags, action=argparse.BooleanOptionalAction, **kw)
            continue
        meta = kind.base.__name__.upper()
        groups[s.part].add_argument(
            *s.flags,
            type=_parse_value(kind, s.flags[0]),
            nargs=kind.length,
            metavar=meta if kind.length is None else (meta,) * kind.length,
            **kw,
        )
    for name, options in _ambiguous().items():
        use = " or ".join(o.flags[0] for o in options)
        parser.add_argument(
            "--" + name.replace("_", "-"), action=_Ambiguous, use=use, help=argparse.SUPPRESS
        )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The config of parsed flags: defaults, then ``--config``'s TOML, then the flags given."""
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        values = load_toml(args.config)
    given = vars(args)
    for s in settings():
        if s.keys[0] in given:
            _put(values, s, given[s.keys[0]])
    return TrainConfig.from_dict(values)
