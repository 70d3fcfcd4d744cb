"""The PNG plot of a run: reward per update and held-out pass rate against the step.

Uses matplotlib (Agg backend) when it is installed, otherwise a small built-in rasteriser
(lines, grid, a 3x5 pixel font) that writes the PNG with ``zlib`` alone, so that a run
always leaves its plot.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_run", "write_png"]

REWARD = (31, 119, 180)
HELD_OUT = (255, 127, 14)
BATCH_PASS = (150, 190, 225)


def plot_run(
    path: str | Path,
    history: Sequence[dict[str, Any]],
    evals: Sequence[tuple[int, float]],
    *,
    title: str = "agentrl train",
    use_matplotlib: bool | None = None,
) -> Path:
    """Writes the plot of ``history`` (per-update dicts with ``step`` and ``reward_mean``,
    optionally ``batch_pass_rate``) and ``evals`` (``(step, held-out pass rate)``). Where
    the records have ``elapsed_s`` and ``sandbox_runs_per_s`` / ``rollouts_per_s`` (as
    ``agentrl train`` writes them), a second panel shows the sandbox and generation
    throughput over the run's time (matplotlib only)."""
    path = Path(path)
    steps = [float(h["step"]) for h in history]
    reward = [float(h["reward_mean"]) for h in history]
    batch_pass = [float(h.get("batch_pass_rate", float("nan"))) for h in history]
    ex = [float(s) for s, _ in evals]
    ey = [float(v) for _, v in evals]
    if use_matplotlib is None:
        try:
            import matplotlib

            use_matplotlib = True
        except ImportError:
            use_matplotlib = False
    if use_matplotlib:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rates = [h for h in history if "elapsed_s" in h and "sandbox_runs_per_s" in h]
        if rates:
            fig, (ax, ax2) = plt.subplots(
                2, 1, figsize=(7, 6.5), dpi=110, gridspec_kw={"height_ratios": [3, 2]}
            )
            t = [float(h["elapsed_s"]) for h in rates]
            ax2.plot(t, [float(h["sandbox_runs_per_s"]) for h in rates], color="#2ca02c",
                     label="sandbox runs/s")  # fmt: skip
            ax2.plot(t, [float(h.get("rollouts_per_s", float("nan"))) for h in rates],
                     color="#9467bd", label="rollouts/s (generation)")  # fmt: skip
            ax2.set_xlabel("seconds since start")
            ax2.set_ylabel("per second")
            ax2.set_ylim(bottom=0)
            ax2.grid(alpha=0.3)
            if any("generator_idle" in h for h in rates):
                ax3 = ax2.twinx()
                ax3.plot(t, [100 * float(h.get("generator_idle", float("nan"))) for h in rates],
                         color="#7f7f7f", ls="--", lw=1, label="generator idle %")  # fmt: skip
                ax3.set_ylim(0, 100)
                ax3.set_ylabel("generator idle %")
                ax3.legend(loc="upper right", fontsize="small")
            ax2.legend(loc="upper left", fontsize="small")
        else:
            fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        ax.plot(steps, reward, color=[c / 255 for c in REWARD], label="reward (batch mean)")
        ax.plot(steps, batch_pass, color=[c / 255 for c in BATCH_PASS], label="pass rate (batch)")
        ax.plot(ex, ey, "o-", color=[c / 255 for c in HELD_OUT], lw=2, label="held-out pass rate")
        ax.set_xlabel("GRPO step")
        ax.set_ylim(min(0.0, *reward, *ey) - 0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path
    canvas = _Canvas(720, 420)
    canvas.chart(
        [(steps, reward, REWARD, 1), (steps, batch_pass, BATCH_PASS, 1), (ex, ey, HELD_OUT, 2)],
        legend=[("reward", REWARD), ("pass", BATCH_PASS), ("held-out pass rate", HELD_OUT)],
    )
    write_png(path, canvas.width, canvas.height, canvas.pixels)
    return path


def write_png(path: str | Path, width: int, height: int, pixels: bytearray) -> None:
    """Writes RGB ``pixels`` (row-major, 3 bytes each) as a PNG file."""
    if len(pixels) != width * height * 3:
        raise ValueError("pixels must hold width * height RGB triples")
    raw = b"".join(
        b"\x00" + bytes(pixels[y * width * 3 : (y + 1) * width * 3]) for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    png = b"\x89PNG\r\n\x1a\n"
    png += chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 6))
    png += chunk(b"IEND", b"")
    Path(path).write_bytes(png)


# 3x5 glyphs, rows top to bottom, 3 bits each (left bit first).
_FONT = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    " ": "000000000000000", "a": "010101111101101", "d": "110101101101110",
    "e": "111100110100111", "g": "111100101101111", "h": "101101111101101",
    "l": "100100100100111", "o": "111101101101111", "p": "111101111100100",
    "r": "110101110101101", "s": "111100111001111", "t": "111010010010010",
    "u": "101101101101111", "w": "101101101111101", "n": "110101101101101",
    "i": "111010010010111", "c": "111100100100111", "(": "010100100100010",
    ")": "010001001001010", "/": "001001010100100",
}  # fmt: skip


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(rgb)

    def line(
        self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int], w: int = 1
    ) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            for ox in range(w):
                for oy in range(w):
                    self.dot(x0 + ox, y0 + oy, rgb)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, s: str, rgb: tuple[int, int, int], scale: int = 2) -> None:
        for ch in s.lower():
            g = _FONT.get(ch, _FONT[" "])
            for r in range(5):
                for col in range(3):
                    if g[r * 3 + col] == "1":
                        for a in range(scale):
                            for b in range(scale):
                                self.dot(x + col * scale + a, y + r * scale + b, rgb)
            x += 4 * scale

    def chart(
        self,
        series: Sequence[tuple[Sequence[float], Sequence[float], tuple[int, int, int], int]],
        legend: Sequence[tuple[str, tuple[int, int, int]]],
    ) -> None:
        left, right, top, bottom = 60, self.width - 20, 40, self.height - 40
        xs = [x for s in series for x in s[0]]
        ys = [y for s in series for y in s[1] if y == y]
        x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        x_hi = x_hi if x_hi > x_lo else x_lo + 1.0
        y_lo = min(0.0, *ys) if ys else 0.0
        y_hi = 1.0

        def px(x: float) -> int:
            return round(left + (x - x_lo) / (x_hi - x_lo) * (right - left))

        def py(y: float) -> int:
            return round(bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top))

        grey, dark = (225, 225, 225), (60, 60, 60)
        for k in range(5):
            v = y_lo + (y_hi - y_lo) * k / 4
            self.line(left, py(v), right, py(v), grey)
            self.text(8, py(v) - 5, f"{v:.2f}", dark)
        for k in range(6):
            v = x_lo + (x_hi - x_lo) * k / 5
            self.line(px(v), top, px(v), bottom, grey)
            self.text(px(v) - 6, bottom + 8, f"{v:.0f}", dark)
        self.line(left, bottom, right, bottom, dark)
        self.line(left, top, left, bottom, dark)
        self.text(right - 4 * 2 * 4, bottom + 24, "step", dark)
        for x, y, rgb, w in series:
            pts = [(px(a), py(b)) for a, b in zip(x, y, strict=True) if b == b]
            for (a0, b0), (a1, b1) in itertools.pairwise(pts):
                self.line(a0, b0, a1, b1, rgb, w)
            if w > 1:
                for a, b in pts:
                    for ox in range(-2, 3):
                        for oy in range(-2, 3):
                            self.dot(a + ox, b + oy, rgb)
        lx = left + 10
        for name, rgb in legend:
            self.line(lx, 18, lx + 20, 18, rgb, 3)
            self.text(lx + 26, 14, name, (40, 40, 40))
            lx += 26 + 8 * len(name) + 24
