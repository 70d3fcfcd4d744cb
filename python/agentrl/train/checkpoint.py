"""Checkpoints of GRPO training: everything needed to continue exactly where it stopped.

A checkpoint directory holds ``policy/`` (the weights, loadable alone with
:meth:`agentrl.policy.Policy.load`), ``trainer.pt`` (weights, optimizer state, step, version),
``rng.pt`` (the torch, Python ``random`` and NumPy generator states) and ``meta.json``
(step, version, the training config and anything the caller adds). Resuming restores the
weights, the optimizer, the step/version and the RNG states, so the next update (and the
next seeded sampling) is the same as it would have been without the interruption.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["get_rng_state", "load_checkpoint", "save_checkpoint", "set_rng_state"]


def get_rng_state() -> dict[str, Any]:
    """The states of the torch (CPU and CUDA), Python and NumPy generators."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency of the train extra
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what :func:`get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def save_checkpoint(path: str | Path, trainer: Any, *, extra: dict[str, Any] | None = None) -> Path:
    """Writes a checkpoint of ``trainer`` (a :class:`~agentrl.train.trainer.GRPOTrainer`)
    to directory ``path``, atomically (a temporary directory renamed into place; an
    existing checkpoint there is replaced). ``extra``: JSON-ready fields for ``meta.json``
    (e.g. the config, the task stream position)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ckpt-", dir=path.parent))
    try:
        trainer.policy.save(tmp / "policy")
        state = trainer.state_dict()
        torch.save(state, tmp / "trainer.pt")
        torch.save(get_rng_state(), tmp / "rng.pt")
        meta = {"step": state["step"], "version": state["version"], **(extra or {})}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
        old = None
        if path.exists():
            old = path.with_name(path.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_checkpoint(path: str | Path, trainer: Any, *, restore_rng: bool = True) -> dict[str, Any]:
    """Restores ``trainer`` (weights, optimizer, step, version) and, with ``restore_rng``,
    the generator states from the checkpoint at ``path``; returns its ``meta.json``."""
    path = Path(path)
    if not (path / "trainer.pt").is_file():
        raise ValueError(f"{str(path)!r} is not a training checkpoint (no trainer.pt)")
    dev = trainer.policy.device
    trainer.load_state_dict(torch.load(path / "trainer.pt", map_location=dev, weights_only=False))
    if restore_rng:
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "meta.json").read_text())
