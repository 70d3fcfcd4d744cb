"""The ``agentrl`` command.

* ``main``: the entry point, the sub-command table (each sub-command's module is imported
  only when it runs), ``agentrl run`` and the help formatting every sub-command shares.
* ``train``, ``eval``, ``demo``: ``agentrl train``, ``agentrl eval`` and ``agentrl demo``.
  ``agentrl serve`` lives with the policy (``agentrl.policy.server``) and ``agentrl
  rootless`` with the sandbox (``agentrl.sandbox.rootless``).
"""

from agentrl.cli.main import main

__all__ = ["main"]
