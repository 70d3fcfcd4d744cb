"""The configuration of ``agentrl train`` (:mod:`agentrl.train.config`): one declaration per
setting (TrainConfig composed of GRPOConfig and SFTConfig), flags and TOML keys generated
from the fields, ``--print-config`` TOML read back by ``--config`` to an equal config,
precedence, refusals naming the key, and the loss defaults taken from the config."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
from pathlib import Path

import pytest
from agentrl.cli.train import add_parser
from agentrl.cli.train import run as cli_run
from agentrl.train import GRPOConfig, SFTConfig, TrainConfig, policy_loss
from agentrl.train.config import config_from_args, field_docs, load_toml, settings, to_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["train", *argv])


def _print_config(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_run(_parse(["--print-config", *argv])) == 0
    return capsys.readouterr().out


NON_DEFAULT = [
    "--seed", "3", "--families", 'arith,list', "--out-dir", 'odd "dir"\\ \u00e9\t\x7f',
    "--no-progress", "--steps", "5", "--sandbox-workers", "2",  # [train]
    "--eps-high", "0.3", "--grpo-lr", "1e-5", "--betas", "0.8", "0.95", "--scale-std",
    "--loss-agg", "dr_grpo", "--is-cap", "0",  # [grpo]
    "--sft-lr", "0.01", "--sft-steps", "0", "--warmup", "0", "--sft-seed", "7",  # [sft]
]  # fmt: skip


@pytest.mark.parametrize("argv", [[], NON_DEFAULT], ids=["defaults", "non-default"])
def test_print_config_round_trips(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _print_config(argv, capsys)
    want = config_from_args(_parse(argv))
    if argv:
        assert want.grpo.eps_high == 0.3 and want.grpo.betas == (0.8, 0.95)
        assert want.sft.lr == 0.01 and want.sft.seed == 7 and want.seed == 3
        assert want.out_dir == 'odd "dir"\\ \u00e9\t\x7f' and not want.progress
    else:
        assert want == TrainConfig()
    data = tomllib.loads(text)
    assert set(data) == {"train", "grpo", "sft"}
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    back = config_from_args(_parse(["--config", str(path)]))
    assert back == want
    assert TrainConfig.from_toml(path) == want
    assert _print_config(["--config", str(path)], capsys) == text  # a fixed point
    # Unset (None) keys are left out: an omitted key means the default.
    for name in ("device", "resume") + (() if argv else ("out_dir", "families")):
        assert name not in data["train"] and f"# {name} = (unset)" in text
    if not argv:
        assert "seed" not in data["sft"]


def test_toml_emitter_values() -> None:
    c = TrainConfig(
        out_dir="a\nb\"c\\\x00\U0001f600", families="arith", held_out=1e-300 * 1e290,
        grpo=GRPOConfig(lr=1e-20, betas=(0.5, 1), eps_high=2.5e16),
    )  # fmt: skip
    back = tomllib.loads(to_toml(c))
    assert back["train"]["out_dir"] == c.out_dir and back["grpo"]["betas"] == [0.5, 1.0]
    assert back["grpo"]["lr"] == 1e-20 and back["grpo"]["eps_high"] == 2.5e16
    assert TrainConfig.from_dict({**back["train"], "grpo": back["grpo"], "sft": back["sft"]}) == c


def test_flags_override_toml_override_defaults(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        "steps = 7\n[grpo]\neps-high = 0.4\nlr = 1e-3\n[sft]\nlr = 2e-2\nbatch_size = 8\n"
    )
    c = config_from_args(_parse(["--config", str(path)]))
    assert (c.steps, c.grpo.eps_high, c.grpo.lr, c.sft.lr, c.sft.batch_size) == (
        7, 0.4, 1e-3, 2e-2, 8,
    )  # fmt: skip
    assert c.group_size == TrainConfig().group_size and c.grpo.eps_low == GRPOConfig().eps_low
    argv = ["--config", str(path), "--steps", "9", "--grpo-eps-high", "0.1", "--sft-lr", "1"]
    c = config_from_args(_parse(argv))
    assert (c.steps, c.grpo.eps_high, c.grpo.lr, c.sft.lr, c.sft.batch_size) == (
        9, 0.1, 1e-3, 1.0, 8,
    )  # fmt: skip
    # Flat keys (at the top level or under [train]), today's names and the prefixed ones.
    path.write_text("[train]\nsft_steps = 3\nsft_lr = 0.5\neps_high = 0.5\ngrpo_lr = 0.25\n")
    c = TrainConfig.from_toml(path, steps=4, sft_batch_size=2, kl_coef=0.5)
    assert (c.sft.steps, c.sft.lr, c.grpo.eps_high, c.grpo.lr) == (3, 0.5, 0.5, 0.25)
    assert (c.steps, c.sft.batch_size, c.grpo.kl_coef) == (4, 2, 0.5)
    assert load_toml(path) == {
        "sft": {"steps": 3, "lr": 0.5},
        "grpo": {"eps_high": 0.5, "lr": 0.25},
    }


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("nope = 1\n", "unknown key 'nope'"),
        (
            "[train]\ngroup_sise = 1\n",
            r"unknown key '\[train\] group_sise' \(did you mean 'group_size'",
        ),
        ("[grpo]\nsteps = 1\n", r"unknown key 'steps' in \[grpo\]"),
        ("[sft]\neps_high = 1\n", r"unknown key 'eps_high' in \[sft\]"),
        ("[gpro]\nlr = 1\n", r"unknown table \[gpro\]"),
        ("lr = 1\n", r"'lr' is ambiguous: use \[grpo\] lr \(grpo_lr\) or \[sft\] lr \(sft_lr\)"),
        ("eps_high = 0.1\n[grpo]\neps_high = 0.2\n", "grpo.eps_high is set twice"),
        ("[grpo]\nlr = 'fast'\n", "GRPOConfig.lr must be a number, got 'fast'"),
        ("[grpo]\nbetas = [0.9]\n", "GRPOConfig.betas must be 2 values"),
        ("[sft]\nbatch_size = 0\n", "SFTConfig.batch_size must be >= 1, got 0"),
    ],
)
def test_unknown_or_bad_toml_is_refused_by_name(
    toml: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises((ValueError, TypeError), match=message):
        config_from_args(_parse(["--config", str(path)]))
    assert cli_run(_parse(["--config", str(path)])) == 2
    assert "agentrl train:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope", "1"], "unrecognized arguments: --nope"),
        (["--lr", "1e-3"], "--lr is ambiguous: use --grpo-lr or --sft-lr"),
        (["--grad-clip", "1"], "--grad-clip is ambiguous: use --grpo-grad-clip or --sft-grad-clip"),
        (["--steps", "many"], "--steps: expected int, got 'many'"),
        (["--betas", "0.9"], "--grpo-betas"),
    ],
)
def test_unknown_or_ambiguous_flag_is_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_every_setting_is_declared_once() -> None:
    parts = {"grpo": GRPOConfig, "sft": SFTConfig}
    own = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for name, cls in parts.items():
        assert own[name].default_factory is cls
    own_settings = set(own) - set(parts)
    for pname, cls in parts.items():
        for f in dataclasses.fields(cls):
            # No flattened copy (sft_lr, grpo_eps_high) in TrainConfig, and a name shared
            # with TrainConfig's own fields only where it is another setting (the RL loop's
            # steps, the run's seed) with a docstring of its own.
            assert f"{pname}_{f.name}" not in own
            if f.name in own_settings:
                assert f.name in ("steps", "seed")
                assert field_docs(cls)[f.name] != field_docs(TrainConfig)[f.name]
    # Each class's fields, each declared once in its source, each with a docstring.
    for cls in (TrainConfig, GRPOConfig, SFTConfig):
        names = [f.name for f in dataclasses.fields(cls)]
        src = inspect.getsource(cls)
        for n in names:
            assert src.count(f"\n    {n}: ") == 1, (cls, n)
            assert field_docs(cls).get(n), f"{cls.__name__}.{n} has no docstring"
    # One setting per field; every flat key and flag names one setting.
    paths = [s.path for s in settings()]
    assert (
        len(paths)
        == len(set(paths))
        == len(own_settings) + sum(len(dataclasses.fields(c)) for c in parts.values())
    )
    keys = [k for s in settings() for k in s.keys]
    assert len(keys) == len(set(keys))
    by_key = {k: s.path for s in settings() for k in s.keys}
    assert by_key["eps_high"] == by_key["grpo_eps_high"] == "grpo.eps_high"
    assert by_key["group_size"] == "group_size" and by_key["steps"] == "steps"
    assert by_key["sft_steps"] == "sft.steps" and by_key["sft_batch_size"] == "sft.batch_size"
    assert by_key["seed"] == "seed" and by_key["sft_seed"] == "sft.seed"
    assert "lr" not in by_key and by_key["sft_lr"] == "sft.lr" and by_key["grpo_lr"] == "grpo.lr"


def test_help_names_the_other_field_of_a_shared_name() -> None:
    p = argparse.ArgumentParser()
    text = " ".join(add_parser(p.add_subparsers(dest="command")).format_help().split())
    assert "AdamW learning rate of GRPO. (default: 0.0003; also [sft] lr: --sft-lr)" in text
    assert "--grpo-eps-high FLOAT, --eps-high FLOAT" in text
    assert "--lr" not in text.replace("--sft-lr", "").replace("--grpo-lr", "")


def test_policy_loss_defaults_are_the_configs() -> None:
    d = GRPOConfig()
    params = inspect.signature(policy_loss).parameters
    assert params["eps_high"].default == d.eps_high == 0.28
    assert params["eps_low"].default == d.eps_low
    assert params["is_cap"].default == (d.is_cap or None)
    assert params["kl_coef"].default == d.kl_coef
    assert params["agg"].default == d.loss_agg


def test_sft_seed_follows_the_run_seed_unless_set() -> None:
    assert TrainConfig(seed=5).sft.seed is None  # the job uses seed 5 for the warm start
    assert config_from_args(_parse(["--seed", "5", "--sft-seed", "none"])).sft.seed is None
    assert config_from_args(_parse(["--sft-seed", "2"])).sft.seed == 2
