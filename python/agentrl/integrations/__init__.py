"""Trainer adapters: :mod:`agentrl.integrations.trl` (reward functions for TRL's
``GRPOTrainer``) and :mod:`agentrl.integrations.verl` (``compute_score`` for verl's reward
managers). Neither imports its trainer: import the submodule you need."""

from __future__ import annotations
