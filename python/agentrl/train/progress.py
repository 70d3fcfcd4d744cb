"""Live progress on the terminal and the metrics log of a training run.

:class:`ProgressView` is a live view on a terminal (rich) and one plain line per update
otherwise (logs, CI). :class:`MetricsLog` appends one JSON object per event to
``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["MetricsLog", "ProgressView", "bar"]


def bar(fraction: float, width: int = 20) -> str:
    """A text bar of ``fraction`` (clamped to [0, 1])."""
    f = 0.0 if not math.isfinite(fraction) else min(1.0, max(0.0, fraction))
    full = round(f * width)
    return "#" * full + "." * (width - full)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


class ProgressView:
    """Status of a run: ``phase`` (e.g. ``"warm start"``, ``"grpo"``), a progress bar of
    ``done/total``, and ``key: value`` fields.

    On a terminal (``live``) it is a `rich <https://github.com/Textualize/rich>`_ live view
    redrawn in place, with the fields in a table below the bar; elsewhere (logs, CI) one plain
    line per update, at most one a second unless forced. ``stream``: where to draw (default
    stderr). ``enabled=False`` draws nothing. :meth:`close` ends the live view.
    """

    def __init__(
        self, stream: TextIO | None = None, *, live: bool | None = None, enabled: bool = True
    ) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.enabled = enabled
        self._t0 = time.monotonic()
        self._last_plain = 0.0
        self._live: Any = None
        self._console: Any = None

    def _render(self, phase: str, done: int, total: int, fields: dict[str, Any]) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        head = Table.grid(padding=(0, 1))
        head.add_row(
            f"[{time.monotonic() - self._t0:6.1f}s]",
            f"[bold]{phase:<11}[/bold]",
            ProgressBar(total=max(total, 1), completed=min(done, max(total, 1)), width=30),
            f"{done}/{total}",
        )
        if not fields:
            return head
        table = Table.grid(padding=(0, 2))
        items = [(k, _fmt(v)) for k, v in fields.items()]
        cols = 4
        for _ in range(cols):
            table.add_column(justify="right", style="dim")
            table.add_column(justify="left")
        for i in range(0, len(items), cols):
            row: list[str] = []
            for k, v in items[i : i + cols]:
                row += [k, v]
            table.add_row(*row)
        return Group(head, table)

    def update(
        self, phase: str, done: int, total: int, fields: dict[str, Any], *, force: bool = False
    ) -> None:
        """Shows the state; plain mode prints at most one line a second unless ``force``."""
        if not self.enabled:
            return
        if self.live:
            if self._live is None:
                from rich.console import Console
                from rich.live import Live

                self._console = Console(file=self.stream, force_terminal=True)
                self._live = Live(
                    console=self._console,
                    auto_refresh=False,
                    redirect_stdout=False,
                    redirect_stderr=False,
                    transient=False,
                )
                self._live.start()
            self._live.update(self._render(phase, done, total, fields), refresh=True)
            return
        now = time.monotonic()
        if not force and now - self._last_plain < 1.0:
            return
        self._last_plain = now
        elapsed = now - self._t0
        head = f"[{elapsed:6.1f}s] {phase:<11} {bar(done / max(total, 1))} {done}/{total}"
        items = [f"{k} {_fmt(v)}" for k, v in fields.items()]
        self.stream.write(head + "  " + "  ".join(items) + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line that stays (printed above the live view)."""
        if not self.enabled:
            return
        if self._live is not None:
            self._console.print(text, markup=False, highlight=False)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends the live view (its last state stays on the terminal). Idempotent."""
        if self._live is not None:
            self._live.stop()
            self._live = None


class MetricsLog:
    """Appends JSON lines to ``path`` (``{"event": ..., "time": ..., ...}``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")
        self._t0 = time.monotonic()

    def write(self, event: str, **fields: Any) -> None:
        """Writes one record (non-finite floats become null)."""
        rec = {"event": event, "time_s": round(time.monotonic() - self._t0, 3)}
        for k, v in fields.items():
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            rec[k] = v
        self._f.write(json.dumps(rec, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
