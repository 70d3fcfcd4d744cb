"""Live progress on the terminal and the metrics log of a training run.

:class:`ProgressView` redraws a small block of status lines in place on a terminal (ANSI
cursor movement) and prints one plain line per update otherwise (logs, CI). :class:`MetricsLog`
appends one JSON object per event to ``metrics.jsonl``.
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
    """Status lines for a run: ``phase`` (e.g. ``"warm start"``, ``"grpo"``), a progress
    bar of ``done/total``, and ``key: value`` fields.

    ``stream``: where to draw (default stderr). ``live``: redraw in place (default: when the
    stream is a terminal). ``enabled=False`` draws nothing.
    """

    def __init__(
        self, stream: TextIO | None = None, *, live: bool | None = None, enabled: bool = True
    ) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.enabled = enabled
        self._drawn = 0
        self._t0 = time.monotonic()
        self._last_plain = 0.0

    def update(
        self, phase: str, done: int, total: int, fields: dict[str, Any], *, force: bool = False
    ) -> None:
        """Shows the state; plain mode prints at most one line a second unless ``force``."""
        if not self.enabled:
            return
        elapsed = time.monotonic() - self._t0
        head = f"[{elapsed:6.1f}s] {phase:<11} {bar(done / max(total, 1))} {done}/{total}"
        items = [f"{k} {_fmt(v)}" for k, v in fields.items()]
        if self.live:
            lines = [head]
            line = " "
            for it in items:
                if len(line) + len(it) + 3 > 100:
                    lines.append(line)
                    line = " "
                line += f" {it} |"
            lines.append(line.rstrip("|").rstrip())
            out = ""
            if self._drawn:
                out += f"\x1b[{self._drawn}F"
            out += "".join(f"\x1b[2K{ln}\n" for ln in lines)
            self.stream.write(out)
            self._drawn = len(lines)
        else:
            now = time.monotonic()
            if not force and now - self._last_plain < 1.0:
                return
            self._last_plain = now
            self.stream.write(head + "  " + "  ".join(items) + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A line that stays (printed above the live block, which is redrawn later)."""
        if not self.enabled:
            return
        self.stream.write(text + "\n")
        self.stream.flush()
        self._drawn = 0


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
