"""The trainer's metrics sinks, chosen as TRL's ``report_to``: ``jsonl`` (``metrics.jsonl``,
the default), ``tensorboard`` (event files, through ``torch.utils.tensorboard``), ``wandb``
(Weights & Biases; the ``WANDB_MODE`` environment variable as wandb reads it, ``offline``
for a local run). :class:`RunReport` writes one event to every chosen sink."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

__all__ = ["REPORT_TO", "RunReport", "check_report_to", "parse_report_to"]

REPORT_TO = ("jsonl", "tensorboard", "wandb", "none")


def parse_report_to(value: str) -> list[str]:
    """``"jsonl,tensorboard"`` -> ``["jsonl", "tensorboard"]``; ``"none"`` -> ``[]``."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in REPORT_TO]
    if bad or not names:
        raise ValueError(f"report_to: unknown {bad or value!r}; use a comma-separated subset of "
                         f"{REPORT_TO}")  # fmt: skip
    if "none" in names and len(names) > 1:
        raise ValueError("report_to: none excludes the others")
    return [n for n in names if n != "none"]


def check_report_to(value: str) -> None:
    """Raises ValueError naming the problem if ``value`` is not a valid ``report_to``."""
    if not isinstance(value, str):
        raise TypeError(f"report_to must be a str, got {type(value).__name__}")
    try:
        parse_report_to(value)
    except ValueError as e:
        raise ValueError(f"TrainConfig.{e}") from None


def _scalars(fields: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in fields.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[k] = float(v)
    return out


class RunReport:
    """Writes a run's events to the sinks of ``report_to`` under ``out_dir``.

    ``write(event, **fields)`` as :class:`agentrl.train.progress.MetricsLog`: the JSONL sink
    gets the whole record; TensorBoard and wandb get its numeric fields as ``event/name``
    scalars, at ``fields["step"]`` when there is one (TensorBoard) or in order (wandb).
    ``config`` is the run's config (wandb's ``config``, TensorBoard's text summary)."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        report_to: str = "jsonl",
        config: dict[str, Any] | None = None,
        run_name: str | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.sinks = parse_report_to(report_to)
        self._jsonl = self._tb = self._wandb = None
        self._n = 0
        try:
            if "jsonl" in self.sinks:
                from agentrl.train.progress import MetricsLog

                self._jsonl = MetricsLog(self.out_dir / "metrics.jsonl")
            if "tensorboard" in self.sinks:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))
                if config:
                    import json

                    self._tb.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")
            if "wandb" in self.sinks:
                import wandb

                self._wandb = wandb.init(
                    project=os.environ.get("WANDB_PROJECT", "agentrl"),
                    name=run_name or self.out_dir.name,
                    dir=str(self.out_dir),
                    config=config or {},
                    reinit="finish_previous",
                )
        except BaseException:
            self.close()
            raise

    def write(self, event: str, **fields: Any) -> None:
        """Writes one event to every sink."""
        if self._jsonl is not None:
            self._jsonl.write(event, **fields)
        scalars = _scalars(fields)
        if not scalars:
            return
        self._n += 1
        if self._tb is not None:
            step = int(scalars.get("step", self._n))
            for k, v in scalars.items():
                if k != "step":
                    self._tb.add_scalar(f"{event}/{k}", v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({f"{event}/{k}": v for k, v in scalars.items()})

    def close(self) -> None:
        """Flushes and closes every sink. Idempotent."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> RunReport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
