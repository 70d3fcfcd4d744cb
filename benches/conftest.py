"""Prints agentrl-vs-anchor ratios after the pytest-benchmark tables."""

from __future__ import annotations

import pytest
from _harness import NOTES, RESULTS, summary_lines


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter) -> None:
    if RESULTS:
        terminalreporter.section("agentrl vs anchors (medians of this run)")
        for line in summary_lines(RESULTS):
            terminalreporter.write_line(line)
    if NOTES:
        terminalreporter.section("derived from the medians")
        for line in NOTES:
            terminalreporter.write_line(line)
