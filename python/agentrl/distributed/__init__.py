"""Sandbox jobs and generation on a Ray cluster (the ``ray`` extra).

* :class:`RayPool`: the :class:`agentrl.SandboxPool` API over one sandbox actor per node
  (``pool``, ``actor``): jobs travel in batches, results stream back, and the jobs of an actor
  or node that dies are re-run elsewhere, each still with exactly one outcome.
* :class:`RayGenerationBackend`: a generation backend (the
  :class:`agentrl.policy.backends.GenerationBackend` protocol) living in a Ray actor, e.g. on
  a GPU node, whose weights are pushed after each update (``generation``).

``import agentrl`` never imports this package (nor Ray); see ``docs/distributed.md``.
"""

from agentrl.distributed.generation import RayGenerationBackend
from agentrl.distributed.pool import RayPool, RayPoolFuture, ray_init_options

__all__ = ["RayGenerationBackend", "RayPool", "RayPoolFuture", "ray_init_options"]
