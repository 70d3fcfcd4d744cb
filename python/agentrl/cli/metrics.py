"""``agentrl metrics dashboard|rules|names``: the shipped Grafana dashboard and Prometheus
alert rules (print them, or ``--out FILE``), and the names of every metric agentrl exposes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

_ASSETS = {"dashboard": "dashboard.json", "rules": "alerts.yml"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``metrics`` subcommand."""
    p = subparsers.add_parser(
        "metrics",
        help="the Grafana dashboard and Prometheus alert rules of agentrl's metrics",
        description=(
            "Prints the Grafana dashboard (JSON, import it in Grafana) or the Prometheus alert "
            "rules (YAML, a rule_files entry) shipped with agentrl, or the metric names."
        ),
    )
    p.add_argument("what", choices=["dashboard", "rules", "names"], help="what to print")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.what == "names":
        from agentrl.observability.metrics import metric_names

        text = "".join(n + "\n" for n in sorted(metric_names()) if not n.endswith("_created"))
    else:
        from agentrl.observability import asset_path

        text = Path(asset_path(_ASSETS[args.what])).read_text(encoding="utf-8")
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as e:
            print(f"agentrl metrics: cannot write {args.out}: {e}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0
