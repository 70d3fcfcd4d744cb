"""The exception tree of agentrl.

``AgentRLError`` is the root; ``SandboxError`` is raised when a sandbox cannot be set up or
used (it says what is missing on the host). Invalid arguments raise ``ValueError`` or
``TypeError`` naming the problem; a value the Rust core refuses (a limit out of range, a bad
path) raises ``InvalidArgument``, a ``ValueError`` whose ``field`` names it and ``reason``
says what is wrong, so a front end can name its own option (``agentrl run --mem``).
"""

from agentrl._core import AgentRLError, InvalidArgument, SandboxError

__all__ = ["AgentRLError", "InvalidArgument", "SandboxError"]
