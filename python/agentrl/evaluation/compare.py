"""Comparisons of a program's stdout with the expected output (done on the host).

The modes live in :mod:`agentrl.languages.compare` (exact, whitespace, float and the rules of
SandboxFusion, CodeContests and LiveCodeBench); this module keeps the Evaluator's old entry
point :func:`outputs_match`.
"""

from __future__ import annotations

from agentrl.languages.compare import COMPARE_MODES, compare_output, normalize_mode, outputs_match

__all__ = ["COMPARE_MODES", "compare_output", "normalize_mode", "outputs_match"]
