"""Generation in Ray actors: :class:`RayGenerationBackend`.

Each replica is an asynchronous Ray actor that holds a generation backend (a
:class:`agentrl.policy.LocalBackend` over a :class:`agentrl.policy.Policy` by default, placed
with ``num_gpus`` on a GPU node where one exists). The driver side satisfies the
:class:`agentrl.policy.backends.GenerationBackend` protocol, so a
:class:`agentrl.RolloutScheduler` and ``train_on_scheduler`` take it as they take a local
backend. New weights travel once through the object store (``ray.put``) to every replica;
generations already running finish on the old weights and later ones use the new, so the
scheduler never stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["RayGenerationBackend"]


class _ShippedPolicy:
    """A :class:`Policy` as it travels (its lock and bound methods do not pickle): the model
    on the CPU, the tokenizer, the version and the stop ids; rebuilt on the replica's device
    (CUDA where the replica has a GPU)."""

    def __init__(self, policy: Any, device: str | None) -> None:
        import copy

        with policy.lock:
            self.model = copy.deepcopy(policy.model).to("cpu")
        self.tokenizer = policy.tokenizer
        self.version = policy.version
        self.dtype = str(policy.dtype).removeprefix("torch.")
        self.eos_ids = sorted(policy.eos_ids)
        self.device = device

    def build(self) -> Any:
        import torch

        from agentrl.policy import Policy

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        return Policy(
            self.model,
            self.tokenizer,
            device=device,
            dtype=self.dtype,
            version=self.version,
            eos_ids=self.eos_ids,
        )


class _GeneratorActor:
    """Holds one backend on its node (the actor side)."""

    def __init__(self, make: Any) -> None:
        from agentrl.policy import LocalBackend, Policy

        backend = make.build() if isinstance(make, _ShippedPolicy) else make()
        self._backend = LocalBackend(backend) if isinstance(backend, Policy) else backend
        self._version = int(getattr(self._backend, "version", 0) or 0)

    async def generate(self, prompts: list[str], params: Any) -> list[Any]:
        return await self._backend.generate(prompts, params)

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> int:
        b = self._backend
        if hasattr(b, "aupdate_weights"):
            await b.aupdate_weights(state_dict, version)
        else:
            await asyncio.get_running_loop().run_in_executor(
                None, b.update_weights, state_dict, version
            )
        self._version = version
        return version

    async def version(self) -> int:
        return self._version

    async def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        close = getattr(self._backend, "close", None)
        if close is not None:
            close()


class RayGenerationBackend:
    """Generation on ``num_replicas`` Ray actors (round robin), weights pushed to all.

    * ``make``: a :class:`agentrl.policy.Policy` (shipped to each replica and served by a
      :class:`LocalBackend` there) or a picklable zero-argument callable that builds the
      backend on the replica (e.g. loads a checkpoint from shared storage onto its GPU).
    * ``num_cpus``, ``num_gpus``, ``resources``: what each replica holds; with
      ``num_gpus=1`` Ray places them on GPU nodes.
    * ``scheduling_strategy``: a Ray strategy for the replicas (default ``SPREAD``).
    * ``device``: where a shipped :class:`Policy` runs on its replica (default: CUDA when
      the replica sees a GPU, else the CPU).
    """

    supports_weight_updates = True

    def __init__(
        self,
        make: Any,
        *,
        num_replicas: int = 1,
        num_cpus: float = 1,
        num_gpus: float = 0,
        resources: Mapping[str, float] | None = None,
        scheduling_strategy: Any = "SPREAD",
        device: str | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        import ray

        from agentrl.policy import Policy

        if not isinstance(make, Policy) and not callable(make):
            raise TypeError("make must be a Policy or a callable that builds a backend")
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive int, got {num_replicas!r}")
        if not ray.is_initialized():
            raise RuntimeError("ray.init() first (or create a RayPool, which connects)")
        cls = ray.remote(_GeneratorActor).options(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=dict(resources) if resources else None,
            scheduling_strategy=scheduling_strategy,
            max_concurrency=16,
        )
        shipped = _ShippedPolicy(make, device) if isinstance(make, Policy) else make
        self._actors = [cls.remote(shipped) for _ in range(num_replicas)]
        try:
            versions = ray.get([a.version.remote() for a in self._actors], timeout=start_timeout)
        except BaseException:
            self.close()
            raise
        self._version = max(versions)
        self._next: Callable[[], Any] = itertools.cycle(self._actors).__next__
        self._closed = False

    @property
    def version(self) -> int:
        """The version last pushed to the replicas."""
        return self._version

    @property
    def replicas(self) -> int:
        return len(self._actors)

    async def generate(self, prompts: Sequence[str], params: Any) -> list[Any]:
        """Completes ``prompts`` on the next replica (one call per batch)."""
        return await self._next().generate.remote(list(prompts), params)

    async def aupdate_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Pushes new weights to every replica (one copy in the object store) and waits."""
        import ray

        ref = ray.put(state_dict)
        await asyncio.gather(*(a.update_weights.remote(ref, version) for a in self._actors))
        self._version = version

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """:meth:`aupdate_weights`, blocking (not from a running event loop)."""
        import ray

        ref = ray.put(state_dict)
        ray.get([a.update_weights.remote(ref, version) for a in self._actors])
        self._version = version

    def nodes(self) -> list[str]:
        """The Ray node id of each replica."""
        import ray

        return ray.get([a.node.remote() for a in self._actors])

    def close(self) -> None:
        """Stops the replicas. Idempotent."""
        import ray

        actors, self._actors = getattr(self, "_actors", []), []
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self._closed = True

    def __enter__(self) -> RayGenerationBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
