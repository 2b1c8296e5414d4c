"""Activation checkpointing across the transformers versions agentrl meets."""

from __future__ import annotations

from typing import Any

import torch


def checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing in every decoder layer, by the name the installed
    transformers gives it: ``activation_checkpointing_enable`` (5.24 deprecates
    ``gradient_checkpointing_enable`` with a warning), or the old name before."""
    m: Any = model
    if hasattr(m, "activation_checkpointing_enable"):
        m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
