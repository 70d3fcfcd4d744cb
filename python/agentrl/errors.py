"""The exception tree of agentrl.

``AgentRLError`` is the root; ``SandboxError`` is raised when a sandbox cannot be set up or
used (it says what is missing on the host). Invalid arguments raise ``ValueError`` or
``TypeError`` naming the problem.
"""

from agentrl._core import AgentRLError, SandboxError

__all__ = ["AgentRLError", "SandboxError"]
