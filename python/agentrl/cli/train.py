"""``agentrl train``: the main job (see :mod:`agentrl.train.job`).

Every setting of :class:`~agentrl.train.config.TrainConfig` and its parts is a flag
(``--steps 80``, ``--no-progress``, ``--eps-high 0.3``, ``--sft-lr 1e-3``; the naming rule is
in :mod:`agentrl.train.config`); ``--config run.toml`` reads them from a TOML file first
(tables ``[train]``, ``[grpo]``, ``[sft]``, or flat keys). ``--print-config`` prints the
resulting config as TOML that ``--config`` reads back.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentrl.train.config import add_config_arguments, config_from_args

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="the main job: warm start + GRPO with sandbox rewards",
        description=(
            "Supervised warm start of the built-in TinyGPT on generated programs, then GRPO "
            "with sandboxed partial-credit rewards on a built-in family of coding tasks; "
            "reports the held-out pass rate before and after RL."
        ),
    )
    add_config_arguments(p)
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the config as TOML (what --config reads) and exit",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        dest="ray_address",
        default=argparse.SUPPRESS,
        help="run the rewards on a Ray cluster (same as --ray-address)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Runs the job with the flags of ``args``; 0 on success, 2 on a bad config."""
    try:
        config = config_from_args(args)
    except (TypeError, ValueError, OSError) as e:
        print(f"agentrl train: {e}", file=sys.stderr)
        return 2
    if getattr(args, "print_config", False):
        print(config.to_toml(), end="")
        return 0
    from agentrl.train.job import run_job

    try:
        summary = run_job(config)
    except KeyboardInterrupt:
        print("agentrl train: interrupted", file=sys.stderr)
        return 130
    print(json.dumps({k: v for k, v in summary.items() if k != "evals"}, indent=2))
    return 0
